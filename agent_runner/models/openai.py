"""Chat model adapter for OpenAI and OpenAI-compatible servers (vLLM, Ollama, LiteLLM, ...).

Needs the optional `openai` extra (`pip install agent-runner[openai]`). Nothing else in
`agent_runner` imports this module, so the core keeps working without the SDK.

Failures are sorted for the runner's retry policy: timeouts, connection errors, 408, 409,
429, 5xx and a stream cut off before its finish reason become `RecoverableError` (carrying
the server's Retry-After); every other API error, and a body that is not a chat
completion, becomes the deterministic `ModelAPIError`. SDK-level retries are off by default so
the runner alone decides when to call again, with backoff that survives a process restart.

Tool-call arguments that are not a JSON object do not raise: the call is kept with
`arguments == {INVALID_ARGUMENTS_KEY: {"raw": <text>, "error": <what is wrong>}}`, which no
tool schema accepts, so the runner answers it with an error `ToolMessage` and the model
can correct itself on its next call.

`OpenAIResponsesModel`, for the Responses API (reasoning kept across tool calls), is
importable from here too; it lives in `agent_runner.models.openai_responses`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import openai
from openai.resources.chat import Completions

from agent_runner.limits import InputLimits
from agent_runner.messages import AiMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from agent_runner.models import ChatRequest, ChatResponse, ToolSpec
from agent_runner.models._adapter import (
    DEFAULT_TIMEOUT,
    ModelAPIError,
    SdkChatModel,
    model_text,
    model_tool_call,
    parse_tool_arguments,
    priced,
    relay_stream,
    sent_arguments,
    stream_cut,
)
from agent_runner.models._openai_common import OpenAIFailures, openai_client
from agent_runner.models.openai_responses import OpenAIResponsesModel
from agent_runner.policy import parse_retry_after
from agent_runner.tools import INVALID_ARGUMENTS_KEY
from agent_runner.usage import Usage

if TYPE_CHECKING:
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionChunk,
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
    )
    from openai.types.completion_usage import CompletionUsage

# Keyword arguments of `chat.completions.create` that the adapter fills from the request.
_RESERVED_SETTINGS: Final = frozenset({"model", "messages", "tools", "stream"})
_ANSWER: Final = "a chat completion"


class OpenAIChatModel(OpenAIFailures, SdkChatModel):
    """A `ChatModel` that calls the chat-completions endpoint of an OpenAI-compatible server.

    Args:
        model: Model name sent with every request.
        base_url: Server URL, for example `http://localhost:11434/v1`; the SDK default
            (or `OPENAI_BASE_URL`) when None.
        api_key: API key; `OPENAI_API_KEY` when None. Servers that check no key still need
            a non-empty string here.
        client: A ready `openai.OpenAI` client to use instead of building one; then
            `base_url`, `api_key` and `timeout` must be left unset. It is not closed by `close()`.
        stream: Stream the answer and pass each text delta to `ChatRequest.on_delta`.
        timeout: Read timeout in seconds of the client built here (connecting gets at most 10 s).
        max_retries: SDK-level retries. Keep 0 so that the runner's retry policy, which
            honours Retry-After and survives restarts, is the only one.
        price: `(input, output)` price per million tokens, used to fill `Usage.cost`.
        rate_limit_key: The shared provider limit its calls count against (default
            `"openai:<model>"`; see `agent_runner.model_limits`).
        limits: Bounds on what the model's answer may put in the snapshot (default: the
            defaults of `InputLimits`; pass the runner's `policy.limits` when you changed
            them). Tool-call arguments over them become invalid-argument calls the model is
            told about; text over `max_message_bytes` is cut, with a note saying so.
        **settings: Passed to `chat.completions.create` unchanged (`temperature`,
            `max_tokens`, `tool_choice`, `extra_body`, ...).

    Raises:
        DefinitionError: Conflicting arguments, or no API key anywhere.
    """

    provider = "openai"
    _reserved_settings = _RESERVED_SETTINGS
    _settings_hint = "pass parameters that only some servers understand in extra_body={...}"
    _answer = _ANSWER

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.OpenAI | None = None,
        stream: bool = False,
        *,
        timeout: float | None = None,
        max_retries: int = 0,
        price: tuple[float, float] | None = None,
        limits: InputLimits | None = None,
        rate_limit_key: str | None = None,
        **settings: Any,
    ) -> None:
        self._init_adapter(model, stream, price, rate_limit_key, limits, settings, _known_settings())
        self._use_clients(*openai_client("OpenAIChatModel", client, api_key, base_url, timeout, max_retries))
        self.settings: dict[str, Any] = settings

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Call the model once and return its message and usage.

        Raises:
            RecoverableError: Timeout, connection failure, 408, 409, 429 or 5xx; `retry_after`
                carries the server's Retry-After in seconds when it sent one.
            ModelAPIError: Any other failure of the API.
        """
        messages = [_to_openai_message(message) for message in request.messages]
        arguments: dict[str, Any] = dict(self.settings)
        if request.tools:
            tools: list[ChatCompletionFunctionToolParam] = [_to_openai_tool(spec) for spec in request.tools]
            arguments["tools"] = tools
        if self.stream:
            # Without include_usage a streamed answer reports no tokens, and budgets would never trip.
            arguments.setdefault("stream_options", {"include_usage": True})
            try:
                chunks = self._client.chat.completions.create(
                    model=self.model, messages=messages, stream=True, **arguments
                )
            except openai.OpenAIError as exc:
                raise self._translate_error(exc) from exc
            with chunks:
                return self._collect_stream(chunks, request.on_delta)
        try:
            completion = self._client.chat.completions.create(
                model=self.model, messages=messages, stream=False, **arguments
            )
            return self._read_completion(completion)
        except openai.OpenAIError as exc:
            raise self._translate_error(exc) from exc
        except (AttributeError, TypeError, ValueError) as exc:
            # A body that is not a chat completion, typically an HTML page from a wrong base_url.
            raise self._unreadable(exc) from exc

    def __repr__(self) -> str:
        return f"OpenAIChatModel(model={self.model!r}, base_url={self._base_url!r}, stream={self.stream})"

    def _read_completion(self, completion: ChatCompletion) -> ChatResponse:
        if not completion.choices:
            raise ModelAPIError(None, f"model {self.model!r} at {self._base_url} answered without any choice")
        message = completion.choices[0].message
        calls: list[ToolCall] = []
        for call in message.tool_calls or []:
            if call.type != "function":
                # Only function tools are ever offered, so anything else is a server bug.
                raise ModelAPIError(None, f"model {self.model!r} returned an unsupported {call.type!r} tool call")
            calls.append(model_tool_call(call.id, call.function.name, call.function.arguments, self.limits))
        return ChatResponse(
            message=AiMessage(
                content=model_text(_answer_text(message.content, message.refusal), self.limits), tool_calls=calls
            ),
            usage=self._usage(completion.usage),
        )

    def _collect_stream(
        self, chunks: openai.Stream[ChatCompletionChunk], on_delta: Callable[[str], None] | None
    ) -> ChatResponse:
        assembly = _StreamAssembly()
        relay_stream(chunks, assembly.add, on_delta, self._reading_failure)
        if not assembly.finished:
            raise stream_cut(self._where)
        return ChatResponse(message=assembly.message(self.limits), usage=self._usage(assembly.usage))

    def _usage(self, usage: CompletionUsage | None) -> Usage:
        if usage is None:
            return Usage()
        input_tokens = usage.prompt_tokens or 0
        output_tokens = usage.completion_tokens or 0
        details = usage.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details is not None else 0
        output_details = usage.completion_tokens_details
        reasoning = (output_details.reasoning_tokens or 0) if output_details is not None else 0
        counted = Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cached,
            reasoning_tokens=reasoning,
        )
        return priced(counted, self.price, self.provider, self.model)


@dataclass
class _PartialToolCall:
    """A tool call being assembled from stream pieces that share one `index`."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _StreamAssembly:
    """The answer being assembled from the chunks of a stream."""

    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _PartialToolCall] = field(default_factory=dict)
    usage: CompletionUsage | None = None
    finished: bool = False
    """Whether a finish reason arrived; without one the stream was cut off."""

    def add(self, chunk: ChatCompletionChunk) -> str | None:
        """Take in one chunk and return its text delta, if it has one."""
        if chunk.usage is not None:
            self.usage = chunk.usage
        text: str | None = None
        # The usage chunk has no choices, and with n > 1 only the first choice is kept.
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.finish_reason is not None:
                self.finished = True
            delta = choice.delta
            if delta.content:
                text = delta.content
                self.content.append(text)
            if delta.refusal:
                self.refusal.append(delta.refusal)
            for piece in delta.tool_calls or []:
                partial = self.calls.setdefault(piece.index, _PartialToolCall())
                # The id and name come once, in the first piece of a call; some servers
                # repeat them in later pieces, so only the first value counts.
                if piece.id and not partial.id:
                    partial.id = piece.id
                if piece.function is not None:
                    if piece.function.name and not partial.name:
                        partial.name = piece.function.name
                    if piece.function.arguments:
                        partial.arguments.append(piece.function.arguments)
        return text

    def message(self, limits: InputLimits) -> AiMessage:
        """The assembled answer, tool calls in index order."""
        calls = [model_tool_call(p.id, p.name, "".join(p.arguments), limits) for _, p in sorted(self.calls.items())]
        content = model_text(_answer_text("".join(self.content) or None, "".join(self.refusal) or None), limits)
        return AiMessage(content=content, tool_calls=calls)


def _known_settings() -> frozenset[str] | None:
    parameters = inspect.signature(Completions.create).parameters
    # An SDK whose `create` takes **kwargs accepts anything: nothing to check then.
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return frozenset(parameters)


def _answer_text(content: str | None, refusal: str | None) -> str | None:
    # A refusal replaces the content, and the person reading the turn should see why.
    return content if content is not None else refusal


def _to_openai_tool(spec: ToolSpec) -> ChatCompletionFunctionToolParam:
    return {
        "type": "function",
        "function": {"name": spec.name, "description": spec.description, "parameters": spec.parameters},
    }


def _to_openai_message(message: SystemMessage | UserMessage | AiMessage | ToolMessage) -> ChatCompletionMessageParam:
    match message:
        case SystemMessage():
            return {"role": "system", "content": message.content}
        case UserMessage():
            return {"role": "user", "content": message.content}
        case ToolMessage():
            return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
        case AiMessage():
            if not message.tool_calls:
                return {"role": "assistant", "content": message.content or ""}
            calls: list[ChatCompletionMessageFunctionToolCallParam] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": sent_arguments(call)},
                }
                for call in message.tool_calls
            ]
            return {"role": "assistant", "content": message.content, "tool_calls": calls}


__all__ = [
    "DEFAULT_TIMEOUT",
    "INVALID_ARGUMENTS_KEY",
    "ModelAPIError",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "parse_retry_after",
    "parse_tool_arguments",
]
