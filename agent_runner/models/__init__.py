"""The chat-model protocol, its request and response types, and the scripted test model."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import ConfigDict, Field

from agent_runner._base import PositionalModel
from agent_runner.errors import DefinitionError, RecoverableError
from agent_runner.messages import AiMessage, ModelMessage
from agent_runner.usage import Usage

logger = logging.getLogger("agent_runner")


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
    model: str | None = None
    """The model that answered (`"<provider>:<model>"`), set when one of several did (`FallbackChatModel`)."""

    if TYPE_CHECKING:

        def __init__(self, message: AiMessage, usage: Usage = ..., *, model: str | None = None) -> None: ...


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


FallbackPredicate = Callable[[Exception], bool]


def falls_over_on_recoverable(error: Exception) -> bool:
    """The default of `FallbackChatModel`: any `RecoverableError` (timeout, 429, 5xx, overloaded, cut stream)."""
    return isinstance(error, RecoverableError)


class FallbackChatModel:
    """A chat model that calls the next of its models when a call fails in a way worth trying elsewhere.

    The first model is asked first on every call. When it fails with an error that
    `fall_over_on` accepts (by default a `RecoverableError`, which the retry schedule
    would otherwise wait on: a rate limit, an overloaded or unreachable provider), the
    next one is asked at once, and so on; the last model's error, or an error not
    accepted, is raised as it came, and the retry policy handles it. The answer's
    `ChatResponse.model` names the model that answered, and the runner records it on the
    MODEL_RESPONSE event.

    Each model keeps its own `rate_limit_key`; the runner's shared limits count the
    calls of the first model (this model's `rate_limit_key` is the first model's).

    Args:
        models: Two or more chat models, in the order to try them.
        fall_over_on: Which failures move on to the next model: a predicate on the
            exception, or a tuple of exception classes.

    Raises:
        DefinitionError: Fewer than two models, or one that is not a `ChatModel`.
    """

    def __init__(
        self,
        models: Sequence[ChatModel],
        *,
        fall_over_on: FallbackPredicate | tuple[type[Exception], ...] = falls_over_on_recoverable,
    ) -> None:
        if isinstance(models, ChatModel) or len(models) < 2:
            raise DefinitionError("FallbackChatModel needs a list of at least two chat models")
        for model in models:
            if not callable(getattr(model, "generate", None)):
                raise DefinitionError(f"FallbackChatModel got {type(model).__name__}, which has no generate()")
        self.models = list(models)
        self.names = [model_name(model, index) for index, model in enumerate(self.models)]
        if isinstance(fall_over_on, tuple):
            classes = fall_over_on
            self._falls_over: FallbackPredicate = lambda error: isinstance(error, classes)
        else:
            self._falls_over = fall_over_on
        self.rate_limit_key: str | None = getattr(self.models[0], "rate_limit_key", None)

    def output_allowance(self) -> int | None:
        """The first model's `max_tokens`, which its shared limit reserves."""
        allowance = getattr(self.models[0], "output_allowance", None)
        value = allowance() if callable(allowance) else None
        return value if isinstance(value, int) else None

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Ask each model in turn until one answers or fails in a way that does not fall over."""
        last = len(self.models) - 1
        for index, model in enumerate(self.models):
            try:
                raw: object = model.generate(request)
            except Exception as error:
                if index == last or not self._falls_over(error):
                    raise
                logger.warning("%s failed (%s); asking %s", self.names[index], error, self.names[index + 1])
                continue
            response = ChatResponse(message=raw) if isinstance(raw, AiMessage) else raw
            if not isinstance(response, ChatResponse):
                raise DefinitionError(f"{self.names[index]} returned {type(raw).__name__}, expected ChatResponse")
            return response.model_copy(update={"model": self.names[index]})
        raise AssertionError("unreachable: the last model's failure is raised")  # pragma: no cover

    def __repr__(self) -> str:
        return f"FallbackChatModel({self.names!r})"


def model_name(model: object, index: int) -> str:
    """`"<provider>:<model>"` for a provider adapter, else its `rate_limit_key`, else its class and place in the list."""
    provider = getattr(model, "provider", None)
    name = getattr(model, "model", None)
    if isinstance(provider, str) and provider and isinstance(name, str):
        return f"{provider}:{name}"
    key = getattr(model, "rate_limit_key", None)
    return key if isinstance(key, str) and key else f"{type(model).__name__}[{index}]"


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
    "FallbackChatModel",
    "LimitedChatModel",
    "ProviderChatModel",
    "ScriptedChatModel",
    "ToolSpec",
    "Usage",
]
