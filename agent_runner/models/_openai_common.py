"""What the OpenAI adapters (chat completions, Responses) share: their client, and how they sort the SDK's failures."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

import openai

from agent_runner.errors import AgentRunnerError, DefinitionError, RecoverableError
from agent_runner.models._adapter import (
    ModelAPIError,
    redact,
    refuse_with_client,
    short_detail,
    status_failure,
    timeouts,
)

# Error types or codes of an error reported inside a stream that a later call may not hit again.
TRANSIENT_STREAM_ERRORS: Final = ("server_error", "rate_limit", "overloaded", "timeout", "unavailable")


def openai_failure(exc: openai.OpenAIError, where: str, api_key: str | None, answer: str) -> AgentRunnerError:
    """Sort an SDK failure: `RecoverableError` for what a later call may not hit again, else `ModelAPIError`.

    Args:
        exc: What the SDK raised.
        where: The model and server, for the message.
        api_key: The key, kept out of the message.
        answer: What a readable answer is (`"a chat completion"`), for an unreadable one.
    """
    if isinstance(exc, openai.APITimeoutError):
        return RecoverableError(f"{where} did not answer in time")
    if isinstance(exc, openai.APIConnectionError):
        # The SDK's own message is a constant; the transport error under it says what failed.
        cause = exc.__cause__ or exc
        return RecoverableError(
            f"{where} could not be reached or dropped the connection: {redact(str(cause), api_key)}"
        )
    if isinstance(exc, openai.APIResponseValidationError):
        return unreadable_answer(exc, where, api_key, answer)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = f"{where} answered HTTP {status}: {redact(_error_detail(exc), api_key)}"
        return status_failure(status, message, exc.response.headers)
    if isinstance(exc, openai.APIError):
        # An `error` event in the middle of a stream: no status, only the error's type.
        return stream_failure(where, _error_detail(exc), f"{exc.type or ''} {exc.code or ''}", api_key)
    return ModelAPIError(None, f"{where} failed: {redact(str(exc), api_key)}")


def stream_failure(where: str, detail: str, kind: str, api_key: str | None) -> AgentRunnerError:
    """An error reported inside a stream (or a failed response): recoverable when `kind` says it is transient."""
    message = f"{where} reported an error while streaming: {redact(short_detail(detail), api_key)}"
    kind = kind.lower()
    if any(marker in kind for marker in TRANSIENT_STREAM_ERRORS):
        return RecoverableError(message, rate_limited="rate_limit" in kind)
    return ModelAPIError(None, message)


def unreadable_answer(exc: Exception, where: str, api_key: str | None, answer: str) -> ModelAPIError:
    """A body that is not `answer`, typically an HTML page from a wrong base_url."""
    return ModelAPIError(
        None, f"{where} sent a response that is not {answer} ({redact(str(exc), api_key)}); check base_url"
    )


def _error_detail(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, Mapping) and isinstance(body.get("message"), str):
        detail: str = body["message"]
    elif isinstance(body, str) and body.strip():
        detail = body
    else:
        detail = exc.message
    return short_detail(detail)


def openai_client(
    owner: str,
    client: openai.OpenAI | None,
    api_key: str | None,
    base_url: str | None,
    timeout: float | None,
    max_retries: int,
) -> tuple[openai.OpenAI, bool]:
    """The client an OpenAI adapter calls through, and whether it built it (and so closes it).

    Raises:
        DefinitionError: A client and client options together, or no API key anywhere.
    """
    if client is not None:
        refuse_with_client(owner, {"api_key": api_key, "base_url": base_url, "timeout": timeout})
        # A copy that shares the caller's connection pool, with our retry setting.
        return client.with_options(max_retries=max_retries), False
    read, connect = timeouts(timeout)
    try:
        built = openai.OpenAI(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=openai.Timeout(read, connect=connect)
        )
    except openai.OpenAIError as exc:
        raise DefinitionError(
            f"{owner} needs an API key: pass api_key (any non-empty string for a server that checks none) "
            "or set OPENAI_API_KEY"
        ) from exc
    return built, True


def reading_failure(exc: Exception, where: str, api_key: str | None, answer: str) -> Exception | None:
    """What to raise for an error met while reading an answer: sorted SDK failures, unreadable bodies, else None."""
    if isinstance(exc, openai.OpenAIError):
        return openai_failure(exc, where, api_key, answer)
    if isinstance(exc, AttributeError | KeyError | TypeError | ValueError):
        return unreadable_answer(exc, where, api_key, answer)
    return None


class OpenAIFailures:
    """How both OpenAI adapters sort what goes wrong; `_answer` names what they read (`"a chat completion"`)."""

    _answer: ClassVar[str]
    model: str
    _base_url: str
    _client: openai.OpenAI

    @property
    def _where(self) -> str:
        return f"model {self.model!r} at {self._base_url}"

    def _translate_error(self, exc: openai.OpenAIError) -> AgentRunnerError:
        return openai_failure(exc, self._where, self._client.api_key, self._answer)

    def _unreadable(self, exc: Exception) -> ModelAPIError:
        return unreadable_answer(exc, self._where, self._client.api_key, self._answer)

    def _reading_failure(self, exc: Exception) -> Exception | None:
        return reading_failure(exc, self._where, self._client.api_key, self._answer)
