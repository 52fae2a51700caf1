"""Middleware: hooks that wrap model calls, tool calls and steps, in onion order.

The first middleware registered is the outermost. A hook receives the call's input and
`call_next`, and returns what `call_next` returned (or an equivalent value for model and
tool calls, for example from a cache). Middleware observes and adapts calls; it cannot
change the turn's state flow: statuses, phases and saves belong to the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agent_runner.messages import ToolCall
from agent_runner.models import ChatRequest, ChatResponse

if TYPE_CHECKING:
    from agent_runner.results import AgentStepResult
    from agent_runner.snapshot import AgentTurn

T = TypeVar("T")
R = TypeVar("R")


class Middleware:
    """Base class: override any of `wrap_model`, `wrap_tool`, `wrap_step`; the defaults pass through."""

    def wrap_model(self, request: ChatRequest, call_next: Callable[[ChatRequest], ChatResponse]) -> ChatResponse:
        """Wrap one model call."""
        return call_next(request)

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        """Wrap one tool execution; `call_next` returns the tool's raw return value."""
        return call_next(tool_call)

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        """Wrap one runner step."""
        return call_next(turn)


def chain(
    middleware: Sequence[Middleware],
    hook: str,
    innermost: Callable[[T], R],
) -> Callable[[T], R]:
    """Compose `hook` of every middleware around `innermost`; the first middleware is outermost."""
    call: Callable[[T], R] = innermost
    for item in reversed(middleware):
        method = getattr(item, hook)
        if getattr(type(item), hook) is getattr(Middleware, hook):
            continue  # not overridden: skip the pass-through frame

        def bind(method: Callable[[T, Callable[[T], R]], R], nxt: Callable[[T], R]) -> Callable[[T], R]:
            return lambda value: method(value, nxt)

        call = bind(method, call)
    return call
