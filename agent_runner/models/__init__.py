"""The chat-model protocol, its request and response types, and the scripted test model."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import ConfigDict, Field

from agent_runner._base import PositionalModel
from agent_runner.errors import DefinitionError
from agent_runner.messages import AiMessage, ModelMessage
from agent_runner.usage import Usage


class ToolSpec(PositionalModel):
    """What the model is told about one tool."""

    _positional: ClassVar[tuple[str, ...]] = ("name", "description", "parameters")

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    if TYPE_CHECKING:

        def __init__(self, name: str, description: str = "", parameters: dict[str, Any] = ...) -> None: ...


class ChatRequest(PositionalModel):
    """One request to a chat model: the model-visible messages (instructions first) and the tools."""

    _positional: ClassVar[tuple[str, ...]] = ("messages", "tools")

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    messages: list[ModelMessage]
    tools: list[ToolSpec] = Field(default_factory=list)
    on_delta: Callable[[str], None] | None = Field(default=None, exclude=True)
    """Called by streaming models with each text delta; the runner turns it into MODEL_DELTA events."""

    if TYPE_CHECKING:

        def __init__(
            self,
            messages: list[ModelMessage],
            tools: list[ToolSpec] = ...,
            *,
            on_delta: Callable[[str], None] | None = None,
        ) -> None: ...


class ChatResponse(PositionalModel):
    """A model's answer and what it cost."""

    _positional: ClassVar[tuple[str, ...]] = ("message", "usage")

    message: AiMessage
    usage: Usage = Field(default_factory=Usage)

    if TYPE_CHECKING:

        def __init__(self, message: AiMessage, usage: Usage = ...) -> None: ...


@runtime_checkable
class ChatModel(Protocol):
    """Anything that answers a `ChatRequest` with a `ChatResponse`.

    Raise `RecoverableError` for failures worth retrying (timeouts, rate limits, 5xx);
    any other exception is treated as deterministic and fails the turn.
    """

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Call the model once."""
        ...


@runtime_checkable
class LimitedChatModel(Protocol):
    """A chat model whose calls count against a shared provider limit (see `agent_runner.model_limits`).

    `rate_limit_key` None: its calls are not counted.
    """

    rate_limit_key: str | None

    def output_allowance(self) -> int | None:
        """The most output tokens one call may produce (`max_tokens`), or None when the model sets none."""
        ...


class ProviderChatModel:
    """The shared part of adapters to a provider's API: the limit key their calls count against.

    A subclass sets `provider` and calls `_init_rate_limit_key(model, rate_limit_key)` from
    its constructor; the key defaults to `"<provider>:<model>"` (for example
    `"openai:gpt-4o-mini"`), so every process calling that model of that provider counts
    against the same limit. Pass another key to count several models (or accounts) apart
    or together.
    """

    provider: ClassVar[str] = ""
    rate_limit_key: str | None = None
    settings: dict[str, Any]

    def _init_rate_limit_key(self, model: str, rate_limit_key: str | None) -> None:
        if rate_limit_key is not None and not rate_limit_key:
            raise DefinitionError(f"{type(self).__name__} got an empty rate_limit_key")
        self.rate_limit_key = rate_limit_key if rate_limit_key is not None else f"{self.provider}:{model}"

    def output_allowance(self) -> int | None:
        """The `max_tokens` (or `max_completion_tokens`, `max_output_tokens`) setting, if one is set."""
        for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            value = getattr(self, "settings", {}).get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None


ScriptItem = AiMessage | ChatResponse | BaseException


class ScriptedChatModel:
    """A deterministic chat model for tests and demos.

    Args:
        items: Either a list whose entries are used one per call (an `AiMessage` or
            `ChatResponse` is returned, an exception instance is raised), or a function
            from `ChatRequest` to `AiMessage | ChatResponse`.
        rate_limit_key: The shared limit its calls count against (None: not counted), to
            exercise `agent_runner.model_limits` without a provider.
        output_allowance: The output tokens one call reserves under a `tpm` limit (None: the limiter's default).

    `requests` records every request received, for assertions.
    """

    def __init__(
        self,
        items: Sequence[ScriptItem] | Callable[[ChatRequest], AiMessage | ChatResponse],
        *,
        rate_limit_key: str | None = None,
        output_allowance: int | None = None,
    ) -> None:
        self.rate_limit_key = rate_limit_key
        self._output_allowance = output_allowance
        self._lock = threading.Lock()
        self._function: Callable[[ChatRequest], AiMessage | ChatResponse] | None = None
        self._items: list[ScriptItem] = []
        if callable(items) and not isinstance(items, Sequence):
            self._function = items
        else:
            for item in items:
                if not isinstance(item, AiMessage | ChatResponse | BaseException):
                    raise DefinitionError(
                        f"ScriptedChatModel items must be AiMessage, ChatResponse or exception instances, "
                        f"got {type(item).__name__}"
                    )
            self._items = list(items)
        self._position = 0
        self.requests: list[ChatRequest] = []

    @property
    def calls(self) -> int:
        """Number of calls made so far."""
        return len(self.requests)

    def output_allowance(self) -> int | None:
        """The output tokens one call reserves under a `tpm` limit (None: the limiter's default)."""
        return self._output_allowance

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Return (or raise) the next scripted item."""
        with self._lock:
            self.requests.append(request)
            if self._function is not None:
                item: ScriptItem = self._function(request)
            else:
                if self._position >= len(self._items):
                    raise IndexError(f"ScriptedChatModel ran out of scripted responses after {len(self._items)} calls")
                item = self._items[self._position]
                self._position += 1
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, AiMessage):
            return ChatResponse(message=item)
        return item


__all__ = [
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "LimitedChatModel",
    "ProviderChatModel",
    "ScriptedChatModel",
    "ToolSpec",
    "Usage",
]
