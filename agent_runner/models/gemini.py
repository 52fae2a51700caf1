"""Chat model adapter for Google's Gemini API, on the official `google-genai` SDK.

Needs the optional `gemini` extra (`pip install agent-runner[gemini]`). Nothing else in
`agent_runner` imports this module.

Gemini signs the parts of an answer it reasoned about (`thought_signature`); they must
come back on the same parts of that answer on the next call, or a thinking model loses
its reasoning across function calls. Each signature is kept as a `ProviderPart` naming
the part it belongs to (the function call's id, or the text), and put back there.

Failures are sorted as `OpenAIChatModel` sorts them: timeouts, connection errors, 408,
409, 429 and 5xx become `RecoverableError` with the server's retry delay (a Retry-After
header, or the `RetryInfo` of the error body); anything else becomes `ModelAPIError`.
"""

from __future__ import annotations

import base64
import importlib
import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from agent_runner.errors import AgentRunnerError, DefinitionError, RecoverableError
from agent_runner.limits import InputLimits
from agent_runner.messages import AiMessage, ModelMessage, ProviderPart, SystemMessage, ToolMessage, UserMessage
from agent_runner.models import ChatRequest, ChatResponse, ToolSpec
from agent_runner.models._adapter import (
    ModelAPIError,
    SdkChatModel,
    arelay_stream,
    joined_by_role,
    model_text,
    model_tool_call,
    priced,
    raise_translated,
    redact,
    refuse_with_client,
    relay_stream,
    short_detail,
    status_failure,
    stream_cut,
)
from agent_runner.usage import Usage

DEFAULT_TIMEOUT_MS: Final = 120_000
"""Milliseconds the client built here waits for an answer."""

_RESERVED_SETTINGS: Final = frozenset({"system_instruction", "tools"})
_DELAY: Final = re.compile(r"^(\d+(?:\.\d+)?)s$")


def _transport_errors() -> tuple[type[Exception], ...]:
    # The SDK speaks through httpx2 (newer releases) or httpx; either raises its TransportError.
    found: list[type[Exception]] = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).TransportError)
        except ImportError:
            continue
    return tuple(found)


_TRANSPORT_ERRORS: Final = _transport_errors()


class GeminiChatModel(SdkChatModel):
    """A `ChatModel` that calls the Gemini API (`generateContent`), keeping thought signatures.

    Args:
        model: Model name, for example `"gemini-2.5-flash"`.
        api_key: API key; `GEMINI_API_KEY` or `GOOGLE_API_KEY` when None.
        client: A ready `google.genai.Client` to use instead of building one (for Vertex AI,
            another base URL, or retry options); then `api_key` must be left unset.
        stream: Stream the answer and pass each text delta to `ChatRequest.on_delta`.
        price: `(input, output)` price per million tokens for `Usage.cost`; when None, the
            `genai-prices` list prices known models (the `prices` extra), cached tokens included.
        rate_limit_key: The shared provider limit its calls count against (default `"google:<model>"`).
        limits: Bounds on what the answer may put in the snapshot (default: `InputLimits()`).
        **settings: Fields of `GenerateContentConfig` (`temperature`, `max_output_tokens`,
            `thinking_config`, ...), sent with every call.

    Raises:
        DefinitionError: Conflicting arguments, or settings `GenerateContentConfig` does not know.
    """

    provider = "google"
    _reserved_settings = _RESERVED_SETTINGS
    _settings_hint = "give fields of GenerateContentConfig"
    part_provider: Final = "gemini"
    """The `ProviderPart.provider` of the thought signatures this adapter keeps."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        client: genai.Client | None = None,
        stream: bool = False,
        price: tuple[float, float] | None = None,
        rate_limit_key: str | None = None,
        limits: InputLimits | None = None,
        **settings: Any,
    ) -> None:
        self._init_adapter(
            model, stream, price, rate_limit_key, limits, settings, types.GenerateContentConfig.model_fields
        )
        if client is not None:
            refuse_with_client("GeminiChatModel", {"api_key": api_key})
            self._client = client
        else:
            try:
                self._client = genai.Client(api_key=api_key, http_options={"timeout": DEFAULT_TIMEOUT_MS})
            except ValueError as exc:
                raise DefinitionError("GeminiChatModel needs an API key: pass api_key or set GEMINI_API_KEY") from exc
        self._api_key = api_key or ""
        self.settings: dict[str, Any] = settings

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Call the model once and return its message and usage.

        Raises:
            RecoverableError: Timeout, connection failure, 408, 409, 429 or 5xx, with the
                server's retry delay in `retry_after`.
            ModelAPIError: Any other failure of the API.
        """
        contents, settings = self.request_arguments(request)
        config = cast(types.GenerateContentConfigDict, settings)
        answer = _Answer()
        try:
            if self.stream:
                chunks: Iterator[types.GenerateContentResponse] = self._client.models.generate_content_stream(
                    model=self.model, contents=contents, config=config
                )
            else:
                chunks = iter(
                    [self._client.models.generate_content(model=self.model, contents=contents, config=config)]
                )
        except Exception as exc:
            raise_translated(exc, self._translate_error)
        relay_stream(chunks, answer.add, request.on_delta if self.stream else None, self._translate_error)
        return self._response(answer)

    async def agenerate(self, request: ChatRequest) -> ChatResponse:
        """`generate` on the client's async side (`client.aio`), for callers on an event loop."""
        contents, settings = self.request_arguments(request)
        config = cast(types.GenerateContentConfigDict, settings)
        answer = _Answer()
        models = self._client.aio.models
        try:
            if self.stream:
                chunks = await models.generate_content_stream(model=self.model, contents=contents, config=config)
            else:
                chunks = _one(await models.generate_content(model=self.model, contents=contents, config=config))
        except Exception as exc:
            raise_translated(exc, self._translate_error)
        await arelay_stream(chunks, answer.add, request.on_delta if self.stream else None, self._translate_error)
        return self._response(answer)

    def request_arguments(self, request: ChatRequest) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The `contents` and `config` of `generate_content` for `request`."""
        config: dict[str, Any] = dict(self.settings)
        instructions = [m.content for m in request.messages if isinstance(m, SystemMessage)]
        if instructions:
            config["system_instruction"] = "\n\n".join(instructions)
        if request.tools:
            config["tools"] = [{"function_declarations": [_to_declaration(spec) for spec in request.tools]}]
        contents = _to_contents((m for m in request.messages if not isinstance(m, SystemMessage)), self.part_provider)
        return contents, config

    def __repr__(self) -> str:
        return f"GeminiChatModel(model={self.model!r}, stream={self.stream})"

    def _response(self, answer: _Answer) -> ChatResponse:
        if not answer.finished:
            raise stream_cut(f"model {self.model!r}")
        calls = [model_tool_call(c.id, c.name, c.arguments, self.limits) for c in answer.calls]
        parts: list[ProviderPart] = []
        for pending, call in zip(answer.calls, calls, strict=True):
            if pending.signature is not None:
                # The call's id may have been made here (Gemini sends none on older models).
                parts.append(
                    ProviderPart(self.part_provider, {"tool_call_id": call.id, "signature": pending.signature})
                )
        parts.extend(ProviderPart(self.part_provider, {"text": True, "signature": s}) for s in answer.text_signatures)
        message = AiMessage(
            content=model_text("".join(answer.text) or None, self.limits), tool_calls=calls, provider_parts=parts
        )
        usage = Usage(
            input_tokens=answer.prompt_tokens,
            output_tokens=answer.output_tokens + answer.thought_tokens,
            cache_read_tokens=answer.cached_tokens,
            reasoning_tokens=answer.thought_tokens,
        )
        return ChatResponse(message=message, usage=priced(usage, self.price, self.provider, self.model))

    def _translate_error(self, exc: Exception) -> AgentRunnerError | None:
        """The failure to raise for `exc` (None: not the API's, raise it as it is)."""
        where = f"model {self.model!r}"
        if isinstance(exc, genai_errors.APIError):
            detail = redact(short_detail(str(exc.message or exc)), self._api_key)
            message = f"{where} answered HTTP {exc.code}: {detail}"
            headers: Mapping[str, str] = getattr(exc.response, "headers", None) or {}
            failure = status_failure(exc.code, message, headers)
            if isinstance(failure, RecoverableError) and failure.retry_after is None:
                failure.retry_after = _retry_delay(exc.details)
            return failure
        if isinstance(exc, _TRANSPORT_ERRORS):
            if "Timeout" in type(exc).__name__:
                return RecoverableError(f"{where} did not answer in time")
            return RecoverableError(f"{where} could not be reached or dropped the connection: {exc!r}")
        if isinstance(exc, AttributeError | KeyError | TypeError | ValueError):
            return ModelAPIError(None, f"{where} sent a response that is not a Gemini answer ({exc})")
        return None


@dataclass
class _PendingCall:
    id: str | None
    name: str
    arguments: str
    signature: str | None


@dataclass
class _Answer:
    """The answer gathered from one response, or from the chunks of a stream."""

    text: list[str] = field(default_factory=list)
    text_signatures: list[str] = field(default_factory=list)
    calls: list[_PendingCall] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    thought_tokens: int = 0
    finished: bool = False
    """Whether a finish reason arrived; without one the stream was cut off."""

    def add(self, chunk: types.GenerateContentResponse) -> str | None:
        """Take in one response (or stream chunk) and return its answer text, if it has some."""
        if chunk.usage_metadata is not None:
            usage = chunk.usage_metadata
            self.prompt_tokens = usage.prompt_token_count or self.prompt_tokens
            self.output_tokens = usage.candidates_token_count or self.output_tokens
            self.cached_tokens = usage.cached_content_token_count or self.cached_tokens
            self.thought_tokens = usage.thoughts_token_count or self.thought_tokens
        if not chunk.candidates:
            return None
        candidate = chunk.candidates[0]
        if candidate.finish_reason is not None:
            self.finished = True
        text: list[str] = []
        for part in (candidate.content.parts if candidate.content else None) or []:
            signature = base64.b64encode(part.thought_signature).decode() if part.thought_signature else None
            if part.function_call is not None:
                call = part.function_call
                arguments = json.dumps(call.args or {})
                self.calls.append(_PendingCall(call.id, call.name or "", arguments, signature))
            elif part.thought:
                # A summary of the model's thinking, not part of its answer.
                continue
            else:
                if part.text:
                    text.append(part.text)
                if signature is not None:
                    self.text_signatures.append(signature)
        self.text.extend(text)
        return "".join(text) or None


async def _one(response: types.GenerateContentResponse) -> AsyncIterator[types.GenerateContentResponse]:
    yield response


def _retry_delay(details: Any) -> float | None:
    # A 429 from Gemini says how long to wait in the error's `RetryInfo` ("retryDelay": "37s").
    error = details.get("error", details) if isinstance(details, Mapping) else {}
    for detail in error.get("details") or [] if isinstance(error, Mapping) else []:
        if isinstance(detail, Mapping) and str(detail.get("@type", "")).endswith("RetryInfo"):
            match = _DELAY.match(str(detail.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None


def _to_declaration(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "parameters_json_schema": spec.parameters}


def _to_contents(messages: Iterable[ModelMessage], part_provider: str) -> list[dict[str, Any]]:
    """The history as Gemini contents; consecutive parts of one role join one content."""
    return joined_by_role((_parts(message, part_provider) for message in messages), "parts")


def _parts(message: ModelMessage, part_provider: str) -> tuple[str, list[dict[str, Any]]]:
    match message:
        case UserMessage():
            return "user", [{"text": message.content}] if message.content else []
        case ToolMessage():
            key = "error" if message.is_error else "result"
            response = {"id": message.tool_call_id, "name": message.tool_name, "response": {key: message.content}}
            return "user", [{"function_response": response}]
        case AiMessage():
            signatures = message.parts_of(part_provider)
            by_call = {s["tool_call_id"]: s["signature"] for s in signatures if "tool_call_id" in s}
            parts: list[dict[str, Any]] = []
            if message.content:
                parts.append({"text": message.content})
            text_signatures = [s["signature"] for s in signatures if s.get("text")]
            if text_signatures:
                if not parts:
                    parts.append({"text": ""})
                parts[-1]["thought_signature"] = base64.b64decode(text_signatures[-1])
            for call in message.tool_calls:
                part: dict[str, Any] = {"function_call": {"id": call.id, "name": call.name, "args": call.arguments}}
                if call.id in by_call:
                    part["thought_signature"] = base64.b64decode(by_call[call.id])
                parts.append(part)
            return "model", parts
        case SystemMessage():
            # Instructions travel in `system_instruction`, never as a content.
            return "user", []


__all__ = ["DEFAULT_TIMEOUT_MS", "GeminiChatModel", "ModelAPIError"]
