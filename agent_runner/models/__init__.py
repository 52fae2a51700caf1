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


ScriptItem = AiMessage | ChatResponse | BaseException


class ScriptedChatModel:
    """A deterministic chat model for tests and demos.

    Args:
        items: Either a list whose entries are used one per call (an `AiMessage` or
            `ChatResponse` is returned, an exception instance is raised), or a function
            from `ChatRequest` to `AiMessage | ChatResponse`.

    `requests` records every request received, for assertions.
    """

    def __init__(self, items: Sequence[ScriptItem] | Callable[[ChatRequest], AiMessage | ChatResponse]) -> None:
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


__all__ = ["ChatModel", "ChatRequest", "ChatResponse", "ScriptedChatModel", "ToolSpec", "Usage"]
