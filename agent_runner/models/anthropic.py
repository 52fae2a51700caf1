"""Chat model adapter for Anthropic's Messages API (Claude), on the official `anthropic` SDK.

Needs the optional `anthropic` extra (`pip install agent-runner[anthropic]`). Nothing else
in `agent_runner` imports this module.

Thinking blocks (and redacted thinking) are kept on the answer as `ProviderPart`s exactly
as received, signature included, and sent back first in the same assistant message on the
next call: the API refuses a tool-use turn whose thinking was changed or dropped. Prompt
caching puts `cache_control` breakpoints on the instructions, the tools and the last block
of the history, which only grows during a turn, so each call reads what the previous one
wrote; `Usage` reports the cache reads and writes.

Failures are sorted as `OpenAIChatModel` sorts them: timeouts, connection errors, 408,
409, 429, 5xx, 529 (overloaded), a transient error event inside a stream and a stream cut
off before `message_stop` become `RecoverableError` with the server's Retry-After; anything
else becomes `ModelAPIError`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anthropic
from anthropic.resources.messages import Messages

from agent_runner.errors import AgentRunnerError, RecoverableError
from agent_runner.limits import InputLimits
from agent_runner.messages import AiMessage, ModelMessage, ProviderPart, SystemMessage, ToolMessage, UserMessage
from agent_runner.models import ChatRequest, ChatResponse, ToolSpec
from agent_runner.models._adapter import (
    ModelAPIError,
    OneCallChatModel,
    joined_by_role,
    model_text,
    model_tool_call,
    priced,
    redact,
    refuse_with_client,
    short_detail,
    status_failure,
    stream_cut,
    timeouts,
)
from agent_runner.usage import Usage

DEFAULT_MAX_TOKENS: Final = 4096
"""`max_tokens` sent when the settings give none (the Messages API requires one)."""

_RESERVED_SETTINGS: Final = frozenset({"model", "messages", "system", "tools", "stream"})
# Error types of an `error` event inside a stream that a later call may not hit again.
_TRANSIENT_STREAM_ERRORS: Final = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
_CACHE: Final[dict[str, Any]] = {"type": "ephemeral"}


class AnthropicChatModel(OneCallChatModel):
    """A `ChatModel` that calls Anthropic's Messages API.

    Args:
        model: Model name, for example `"claude-sonnet-4-5"`.
        api_key: API key; `ANTHROPIC_API_KEY` when None.
        base_url: API URL; the SDK default (or `ANTHROPIC_BASE_URL`) when None.
        client: A ready `anthropic.Anthropic` client to use instead of building one; then
            `api_key`, `base_url` and `timeout` must be left unset. It is not closed by `close()`.
        stream: Stream the answer and pass each text delta to `ChatRequest.on_delta`.
        cache: Put prompt-cache breakpoints on the instructions, the tools and the history.
        async_client: A ready `anthropic.AsyncAnthropic` for `agenerate` (by default one is
            built on first use from the sync client's key, URL and timeouts).
        timeout: Read timeout in seconds of the client built here.
        max_retries: SDK-level retries; keep 0 so that the runner's retry policy is the only one.
        price: `(input, output)` price per million tokens for `Usage.cost`; when None, the
            `genai-prices` list prices known models (the `prices` extra), cache reads and writes included.
        rate_limit_key: The shared provider limit its calls count against (default `"anthropic:<model>"`).
        limits: Bounds on what the answer may put in the snapshot (default: `InputLimits()`).
        **settings: Passed to `messages.create` unchanged (`max_tokens`, `thinking`,
            `temperature`, `tool_choice`, ...); `max_tokens` defaults to 4096.

    Raises:
        DefinitionError: Conflicting arguments or settings the SDK does not know.
    """

    provider = "anthropic"
    _reserved_settings = _RESERVED_SETTINGS

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: anthropic.Anthropic | None = None,
        stream: bool = False,
        cache: bool = True,
        async_client: anthropic.AsyncAnthropic | None = None,
        timeout: float | None = None,
        max_retries: int = 0,
        price: tuple[float, float] | None = None,
        rate_limit_key: str | None = None,
        limits: InputLimits | None = None,
        **settings: Any,
    ) -> None:
        self._init_adapter(
            model, stream, price, rate_limit_key, limits, settings, inspect.signature(Messages.create).parameters
        )
        if client is not None:
            refuse_with_client("AnthropicChatModel", {"api_key": api_key, "base_url": base_url, "timeout": timeout})
            self._use_clients(client.with_options(max_retries=max_retries), False, async_client, max_retries)
        else:
            read, connect = timeouts(timeout)
            built = anthropic.Anthropic(
                api_key=api_key,
                base_url=base_url,
                max_retries=max_retries,
                timeout=anthropic.Timeout(read, connect=connect),
            )
            self._use_clients(built, True, async_client, max_retries)
        self.cache = cache
        self.settings: dict[str, Any] = {"max_tokens": DEFAULT_MAX_TOKENS, **settings}

    def request_arguments(self, request: ChatRequest) -> dict[str, Any]:
        """The keyword arguments of `messages.create` for `request` (without `stream`)."""
        system: list[dict[str, Any]] = [
            {"type": "text", "text": m.content} for m in request.messages if isinstance(m, SystemMessage)
        ]
        messages = _to_anthropic_messages(m for m in request.messages if not isinstance(m, SystemMessage))
        tools = [_to_anthropic_tool(spec) for spec in request.tools]
        if self.cache:
            # Each breakpoint caches everything before it; the history only grows during a
            # turn, so its last block is where the next call's cache read starts.
            for blocks in (system, tools, messages[-1]["content"] if messages else []):
                cacheable = [b for b in blocks if b.get("type") not in ("thinking", "redacted_thinking")]
                if cacheable:
                    cacheable[-1]["cache_control"] = _CACHE
        arguments: dict[str, Any] = {**self.settings, "model": self.model, "messages": messages}
        if system:
            arguments["system"] = system
        if tools:
            arguments["tools"] = tools
        return arguments

    def __repr__(self) -> str:
        return f"AnthropicChatModel(model={self.model!r}, base_url={self._base_url!r}, stream={self.stream})"

    def _create(self, client: Any, arguments: dict[str, Any], stream: bool) -> Any:
        return client.messages.create(stream=stream, **arguments)

    def _read_answer(self, answer: Any) -> ChatResponse:
        assembly = _Assembly()
        for block in answer.content:
            assembly.add_block(block.to_dict())
        assembly.add_usage(answer.usage.to_dict())
        return self._response(assembly)

    def _stream_reader(self) -> tuple[Callable[[Any], str | None], Callable[[], ChatResponse]]:
        assembly = _Assembly()

        def finish() -> ChatResponse:
            if not assembly.finished:
                raise stream_cut(f"model {self.model!r} at {self._base_url}")
            return self._response(assembly)

        return lambda event: assembly.add_event(event.to_dict()), finish

    def _async(self) -> anthropic.AsyncAnthropic:
        client: anthropic.AsyncAnthropic = self._async_twin(anthropic.AsyncAnthropic)
        return client

    def _response(self, assembly: _Assembly) -> ChatResponse:
        calls = [model_tool_call(c.id, c.name, c.arguments, self.limits) for c in assembly.calls]
        message = AiMessage(
            content=model_text("".join(assembly.text) or None, self.limits),
            tool_calls=calls,
            provider_parts=[ProviderPart(self.provider, part) for part in assembly.parts],
        )
        usage = Usage(
            input_tokens=assembly.input_tokens + assembly.cache_read + assembly.cache_write,
            output_tokens=assembly.output_tokens,
            cache_read_tokens=assembly.cache_read,
            cache_write_tokens=assembly.cache_write,
        )
        return ChatResponse(message=message, usage=priced(usage, self.price, self.provider, self.model))

    def _translate_error(self, exc: anthropic.AnthropicError) -> AgentRunnerError:
        where = f"model {self.model!r} at {self._base_url}"
        if isinstance(exc, anthropic.APITimeoutError):
            return RecoverableError(f"{where} did not answer in time")
        if isinstance(exc, anthropic.APIConnectionError):
            return RecoverableError(f"{where} could not be reached or dropped the connection: {self._redact(exc)}")
        if isinstance(exc, anthropic.APIResponseValidationError):
            return self._unreadable(exc)
        if isinstance(exc, anthropic.APIStatusError):
            error = _error_of(exc.body)
            detail = self._redact(str(error.get("message") or exc.message))
            kind = str(error.get("type") or "")
            if exc.status_code < 400:
                # An `error` event inside a stream that had started well (HTTP 200).
                message = f"{where} reported {kind or 'an error'} while streaming: {detail}"
                if kind in _TRANSIENT_STREAM_ERRORS:
                    return RecoverableError(message, rate_limited=kind == "rate_limit_error")
                return ModelAPIError(None, message)
            return status_failure(
                exc.status_code, f"{where} answered HTTP {exc.status_code}: {detail}", exc.response.headers
            )
        return ModelAPIError(None, f"{where} failed: {self._redact(exc)}")

    def _reading_failure(self, exc: Exception) -> Exception | None:
        if isinstance(exc, anthropic.AnthropicError):
            return self._translate_error(exc)
        if isinstance(exc, AttributeError | KeyError | TypeError | ValueError):
            return self._unreadable(exc)
        return None

    def _unreadable(self, exc: Exception) -> ModelAPIError:
        return ModelAPIError(
            None,
            f"model {self.model!r} at {self._base_url} sent a response that is not a Messages API answer "
            f"({self._redact(exc)}); check base_url",
        )

    def _redact(self, error: BaseException | str) -> str:
        return redact(short_detail(str(error)), self._client.api_key)


@dataclass
class _PendingCall:
    id: str
    name: str
    arguments: str


@dataclass
class _Assembly:
    """The answer gathered from the content blocks of a message, or from the events of a stream."""

    text: list[str] = field(default_factory=list)
    calls: list[_PendingCall] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    finished: bool = False
    """Whether `message_stop` arrived; without it the stream was cut off."""
    _open: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add_block(self, block: dict[str, Any]) -> None:
        """Take in one finished content block."""
        kind = block.get("type")
        if kind == "text":
            self.text.append(block["text"])
        elif kind == "tool_use":
            raw = block.get("input")
            arguments = raw if isinstance(raw, str) else json.dumps(raw if raw is not None else {})
            self.calls.append(_PendingCall(block["id"], block["name"], arguments))
        elif kind is not None:
            # Thinking, redacted thinking and server tool blocks go back exactly as they came.
            self.parts.append(block)

    def add_usage(self, usage: Mapping[str, Any]) -> None:
        """Take in a usage object; a stream's later counts replace its earlier ones."""
        for name, attribute in (
            ("input_tokens", "input_tokens"),
            ("output_tokens", "output_tokens"),
            ("cache_read_input_tokens", "cache_read"),
            ("cache_creation_input_tokens", "cache_write"),
        ):
            value = usage.get(name)
            if isinstance(value, int):
                setattr(self, attribute, value)

    def add_event(self, event: dict[str, Any]) -> str | None:
        """Take in one stream event and return its text delta, if it has one."""
        kind = event.get("type")
        if kind == "message_start":
            self.add_usage(event["message"].get("usage") or {})
        elif kind == "content_block_start":
            block = dict(event["content_block"])
            if block.get("type") == "tool_use":
                # The input arrives as JSON text in pieces; the empty object here is a placeholder.
                block["input"] = ""
            self._open[event["index"]] = block
        elif kind == "content_block_delta":
            return self._add_delta(self._open[event["index"]], event["delta"])
        elif kind == "content_block_stop":
            self.add_block(self._open.pop(event["index"]))
        elif kind == "message_delta":
            self.add_usage(event.get("usage") or {})
        elif kind == "message_stop":
            self.finished = True
        return None

    @staticmethod
    def _add_delta(block: dict[str, Any], delta: dict[str, Any]) -> str | None:
        match delta.get("type"):
            case "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
                return str(delta["text"])
            case "input_json_delta":
                block["input"] += delta["partial_json"]
            case "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            case "signature_delta":
                block["signature"] = block.get("signature", "") + delta["signature"]
            case "citations_delta":
                block.setdefault("citations", []).append(delta["citation"])
        return None


def _error_of(body: object) -> Mapping[str, Any]:
    # `{"type": "error", "error": {"type": ..., "message": ...}}`, read from the body so
    # that SDK releases with and without parsed error attributes sort alike.
    error = body.get("error") if isinstance(body, Mapping) else None
    return error if isinstance(error, Mapping) else {}


def _to_anthropic_tool(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}


def _to_anthropic_messages(messages: Iterable[ModelMessage]) -> list[dict[str, Any]]:
    """The history as Messages API turns; consecutive blocks of one role join one turn, as the API requires."""
    return joined_by_role((_blocks(message) for message in messages), "content")


def _blocks(message: ModelMessage) -> tuple[str, list[dict[str, Any]]]:
    match message:
        case UserMessage():
            return "user", [{"type": "text", "text": message.content}] if message.content else []
        case ToolMessage():
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
            }
            if message.is_error:
                result["is_error"] = True
            return "user", [result]
        case AiMessage():
            # Thinking first, exactly as received: the API checks the signed blocks.
            blocks = [dict(part) for part in message.parts_of(AnthropicChatModel.provider)]
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            blocks.extend(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
                for call in message.tool_calls
            )
            return "assistant", blocks
        case SystemMessage():
            # Instructions travel in `system`, never as a turn.
            return "user", []


__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicChatModel", "ModelAPIError"]
