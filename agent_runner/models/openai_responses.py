"""Chat model adapter for the OpenAI Responses API (re-exported by `agent_runner.models.openai`).

Needs the optional `openai` extra. Calls are stateless (`store=False`): the whole history
is sent each time, and the reasoning items a reasoning model writes come back with their
encrypted content (`include=["reasoning.encrypted_content"]`), kept on the answer as
`ProviderPart`s and sent back verbatim before that answer's calls, so the model continues
its reasoning across tool calls instead of starting over.

Failures are sorted as `OpenAIChatModel` sorts them; a `response.failed` or `error` event
whose code is transient (server error, rate limit) is recoverable too.

With `background=True` the response runs on the provider's side (`background: true`, which
needs `store: true`): `generate` starts it and raises `OperationPending` with its id instead
of waiting, the runner saves the id and waits without a thread, and each poll reads the
response by id (`poll_operation`); a turn that ends meanwhile cancels it (`cancel_operation`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import openai
from openai.resources.responses import Responses

from agent_runner.errors import AgentRunnerError, DefinitionError
from agent_runner.limits import InputLimits
from agent_runner.messages import AiMessage, ModelMessage, ProviderPart, SystemMessage, ToolMessage, UserMessage
from agent_runner.models import ChatRequest, ChatResponse, ToolSpec
from agent_runner.models._adapter import (
    ModelAPIError,
    OneCallChatModel,
    model_text,
    model_tool_call,
    priced,
    raise_translated,
    sent_arguments,
    stream_cut,
)
from agent_runner.models._openai_common import OpenAIFailures, openai_client, stream_failure
from agent_runner.operations import OperationPending
from agent_runner.usage import Usage

_RESERVED_SETTINGS: Final = frozenset({"model", "input", "tools", "stream", "background"})
_ENCRYPTED_REASONING: Final = "reasoning.encrypted_content"
_ANSWER: Final = "a Responses API answer"
# A response that ended (possibly cut by max_output_tokens) is an answer; a failed one is not.
_FINAL_EVENTS: Final = frozenset({"response.completed", "response.incomplete"})
_RUNNING: Final = frozenset({"queued", "in_progress"})
RESPONSE_ID_KEY: Final = "response_id"
"""Key of the response id in the handle of a background response (see `agent_runner.operations`)."""


class OpenAIResponsesModel(OpenAIFailures, OneCallChatModel):
    """A `ChatModel` that calls the OpenAI Responses API, keeping reasoning items across calls.

    Args:
        model: Model name, for example `"o4-mini"` or `"gpt-5"`.
        api_key: API key; `OPENAI_API_KEY` when None.
        base_url: Server URL; the SDK default (or `OPENAI_BASE_URL`) when None.
        client: A ready `openai.OpenAI` client to use instead of building one; then
            `api_key`, `base_url` and `timeout` must be left unset. It is not closed by `close()`.
        stream: Stream the answer and pass each text delta to `ChatRequest.on_delta`.
        background: Start each response in the background and let the turn wait for it
            without holding a thread: the response id is saved in the snapshot and read again
            on a backing-off schedule (1 s doubling up to 60 s) until it ends. Needs `store=True`
            (the default then) and no `stream`.
        async_client: A ready `openai.AsyncOpenAI` for `agenerate` (by default one is built
            on first use from the sync client's key, URL and timeouts).
        timeout: Read timeout in seconds of the client built here.
        max_retries: SDK-level retries; keep 0 so that the runner's retry policy is the only one.
        price: `(input, output)` price per million tokens for `Usage.cost`; when None, the
            `genai-prices` list prices known models (the `prices` extra), cached tokens included.
        rate_limit_key: The shared provider limit its calls count against (default `"openai:<model>"`).
        limits: Bounds on what the answer may put in the snapshot (default: `InputLimits()`).
        **settings: Passed to `responses.create` unchanged (`reasoning`, `max_output_tokens`,
            `instructions`, `tool_choice`, ...). `store` defaults to False (True with
            `background`) and `include` always asks for the encrypted reasoning.

    Raises:
        DefinitionError: Conflicting arguments or unknown settings.
    """

    provider = "openai"
    _reserved_settings = _RESERVED_SETTINGS
    _answer = _ANSWER
    part_provider: Final = "openai_responses"
    """The `ProviderPart.provider` of the reasoning items this adapter keeps."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: openai.OpenAI | None = None,
        stream: bool = False,
        background: bool = False,
        async_client: openai.AsyncOpenAI | None = None,
        timeout: float | None = None,
        max_retries: int = 0,
        price: tuple[float, float] | None = None,
        rate_limit_key: str | None = None,
        limits: InputLimits | None = None,
        **settings: Any,
    ) -> None:
        if background and (stream or settings.get("store") is False):
            raise DefinitionError(
                "OpenAIResponsesModel(background=True) cannot stream and needs store=True "
                "(the provider keeps a background response to be read later); drop stream=True and store=False"
            )
        self._init_adapter(
            model, stream, price, rate_limit_key, limits, settings, inspect.signature(Responses.create).parameters
        )
        self._use_clients(
            *openai_client("OpenAIResponsesModel", client, api_key, base_url, timeout, max_retries),
            async_client,
            max_retries,
        )
        self.background = background
        include = list(settings.pop("include", None) or [])
        if _ENCRYPTED_REASONING not in include:
            include.append(_ENCRYPTED_REASONING)
        self.settings: dict[str, Any] = {"store": background, **settings, "include": include}

    def request_arguments(self, request: ChatRequest) -> dict[str, Any]:
        """The keyword arguments of `responses.create` for `request` (without `stream`)."""
        arguments: dict[str, Any] = {
            **self.settings,
            "model": self.model,
            "input": _to_input_items(request.messages, self.part_provider),
        }
        if request.tools:
            arguments["tools"] = [_to_function_tool(spec) for spec in request.tools]
        return arguments

    def __repr__(self) -> str:
        return f"OpenAIResponsesModel(model={self.model!r}, base_url={self._base_url!r}, stream={self.stream}" + (
            ", background=True)" if self.background else ")"
        )

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Call the model once; with `background`, start the response and raise `OperationPending` with its id.

        Raises:
            OperationPending: (background only) The response runs; poll it with `poll_operation`.
            RecoverableError: Timeout, connection failure, 408, 409, 429, 5xx, or a transient failure.
            ModelAPIError: Any other failure of the API, or an answer that cannot be read.
        """
        if not self.background:
            return super().generate(request)
        try:
            started = self._client.responses.create(background=True, **self.request_arguments(request)).to_dict()
        except Exception as exc:
            raise_translated(exc, self._reading_failure)
        return self._settle(started)

    async def agenerate(self, request: ChatRequest) -> ChatResponse:
        """`generate` on the SDK's async client; with `background`, it too starts the response and raises `OperationPending`."""
        if not self.background:
            return await super().agenerate(request)
        try:
            started = await self._async().responses.create(background=True, **self.request_arguments(request))
        except Exception as exc:
            raise_translated(exc, self._reading_failure)
        return self._settle(started.to_dict())

    def poll_operation(self, handle: Mapping[str, Any]) -> ChatResponse:
        """Read the background response `handle` names (`GET /responses/{id}`): its answer once it has ended.

        Raises:
            OperationPending: It is still queued or in progress.
            RecoverableError: It failed for a transient reason, or the read itself failed so.
            ModelAPIError: It failed or was cancelled, or the read failed for another reason.
        """
        try:
            response = self._client.responses.retrieve(str(handle[RESPONSE_ID_KEY])).to_dict()
        except Exception as exc:
            raise_translated(exc, self._reading_failure)
        return self._settle(response)

    def cancel_operation(self, handle: Mapping[str, Any]) -> None:
        """Cancel the background response `handle` names (`POST /responses/{id}/cancel`)."""
        try:
            self._client.responses.cancel(str(handle[RESPONSE_ID_KEY]))
        except Exception as exc:
            raise_translated(exc, self._reading_failure)

    def _settle(self, response: dict[str, Any]) -> ChatResponse:
        status = response.get("status")
        if status in _RUNNING:
            raise OperationPending({RESPONSE_ID_KEY: response["id"]}, status=str(status))
        if status == "cancelled":
            raise ModelAPIError(None, f"{self._where}: the background response {response.get('id')} was cancelled")
        try:
            return self._read(response)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise self._unreadable(exc) from exc

    def _create(self, client: Any, arguments: dict[str, Any], stream: bool) -> Any:
        return client.responses.create(stream=stream, **arguments)

    def _read_answer(self, answer: Any) -> ChatResponse:
        return self._read(answer.to_dict())

    def _stream_reader(self) -> tuple[Callable[[Any], str | None], Callable[[], ChatResponse]]:
        final: list[dict[str, Any]] = []

        def read(event: Any) -> str | None:
            data = event.to_dict()
            kind = data.get("type")
            if kind in _FINAL_EVENTS or kind == "response.failed":
                final.append(data["response"])
            elif kind == "error":
                raise self._failed(data)
            elif kind == "response.output_text.delta":
                return str(data.get("delta") or "")
            return None

        def finish() -> ChatResponse:
            if not final:
                raise stream_cut(self._where)
            try:
                return self._read(final[-1])
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise self._unreadable(exc) from exc

        return read, finish

    def _async(self) -> openai.AsyncOpenAI:
        client: openai.AsyncOpenAI = self._async_twin(openai.AsyncOpenAI)
        return client

    def _read(self, response: Mapping[str, Any]) -> ChatResponse:
        if response.get("status") == "failed":
            raise self._failed(response.get("error") or {})
        answer = _Answer()
        for item in response["output"]:
            answer.add(item)
        usage = response.get("usage") or {}
        counted = Usage(
            input_tokens=usage.get("input_tokens") or 0,
            output_tokens=usage.get("output_tokens") or 0,
            cache_read_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens") or 0,
            reasoning_tokens=(usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0,
        )
        message = AiMessage(
            content=model_text("".join(answer.text) or None, self.limits),
            tool_calls=[model_tool_call(c, n, a, self.limits) for c, n, a in answer.calls],
            provider_parts=[ProviderPart(self.part_provider, item) for item in answer.parts],
        )
        return ChatResponse(message=message, usage=priced(counted, self.price, self.provider, self.model))

    def _failed(self, error: Mapping[str, Any]) -> AgentRunnerError:
        detail = str(error.get("message") or "the response failed")
        kind = f"{error.get('type') or ''} {error.get('code') or ''}"
        return stream_failure(self._where, detail, kind, self._client.api_key)


@dataclass
class _Answer:
    """The text, calls and kept items of a response's output."""

    text: list[str] = field(default_factory=list)
    calls: list[tuple[str | None, str, str]] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)

    def add(self, item: dict[str, Any]) -> None:
        match item.get("type"):
            case "message":
                for part in item.get("content") or []:
                    # A refusal replaces the text, and the person reading the turn should see why.
                    if part.get("type") == "output_text":
                        self.text.append(part.get("text") or "")
                    elif part.get("type") == "refusal":
                        self.text.append(part.get("refusal") or "")
            case "function_call":
                self.calls.append((item.get("call_id"), item.get("name") or "", item.get("arguments") or ""))
            case _:
                # Reasoning items (and built-in tool items) go back as they came.
                self.parts.append(item)


def _to_function_tool(spec: ToolSpec) -> dict[str, Any]:
    # Not strict: strict mode requires every property to be required, which tool schemas rarely say.
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.parameters,
        "strict": False,
    }


def _to_input_items(messages: Iterable[ModelMessage], part_provider: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for message in messages:
        match message:
            case SystemMessage():
                items.append({"role": "system", "content": message.content})
            case UserMessage():
                items.append({"role": "user", "content": message.content})
            case ToolMessage():
                items.append(
                    {"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content}
                )
            case AiMessage():
                # The reasoning that led to this answer first, exactly as received.
                items.extend(dict(part) for part in message.parts_of(part_provider))
                if message.content:
                    items.append({"role": "assistant", "content": message.content})
                items.extend(
                    {"type": "function_call", "call_id": call.id, "name": call.name, "arguments": sent_arguments(call)}
                    for call in message.tool_calls
                )
    return items


__all__ = ["OpenAIResponsesModel"]
