"""Hooks through which an observability layer follows turns, using the standard library only.

Nothing here records or exports anything; `workers.telemetry` (traces, metrics, logs) plugs
into these hooks when its optional packages are installed. Two pieces live in the core so
that `agent_runner` never needs a telemetry package:

- The step context: `step_scope(turn)` marks what the current thread (or task) is stepping,
  and `current_step()` reads it, so that log filters and spans can name the turn, its root,
  its agent and its attempt without being handed the snapshot.
- The new-turn hook: `set_new_turn_hook(runner, hook)` registers a function that returns the
  trace context (a text carrier such as `{"traceparent": "00-..."}`) to keep in a new turn's
  `trace_context`. The runner calls `stamp_new_turn` where it creates root and child turns.
  Without a hook a turn keeps an empty context and nothing else happens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from agent_runner.snapshot import AgentTurn

logger = logging.getLogger("agent_runner.telemetry_hooks")


@dataclass(frozen=True, slots=True)
class StepContext:
    """The turn a step works on, as logs and spans name it."""

    turn_id: str
    root_turn_id: str
    agent_id: str
    attempt: int
    """Failed attempts of the turn's current model or tool call before this step."""
    parent_turn_id: str | None = None
    conversation_id: str | None = None

    @classmethod
    def of(cls, turn: AgentTurn) -> StepContext:
        """The context of a step of `turn`."""
        return cls(
            turn_id=turn.id,
            root_turn_id=turn.root_turn_id,
            agent_id=turn.agent_id,
            attempt=turn.attempt,
            parent_turn_id=turn.parent_turn_id,
            conversation_id=turn.conversation_id,
        )


_current_step: ContextVar[StepContext | None] = ContextVar("agent_runner_current_step", default=None)


def current_step() -> StepContext | None:
    """The step the calling thread or task is inside, or None outside any step."""
    return _current_step.get()


def enter_step(turn: AgentTurn) -> Token[StepContext | None]:
    """Mark the calling thread or task as stepping `turn`; pass the token to `exit_step` afterwards."""
    return _current_step.set(StepContext.of(turn))


def exit_step(token: Token[StepContext | None]) -> None:
    """Undo the `enter_step` that returned `token`."""
    _current_step.reset(token)


@contextmanager
def step_scope(turn: AgentTurn) -> Iterator[StepContext]:
    """Mark the code inside the block as part of a step of `turn`; nests and restores."""
    context = StepContext.of(turn)
    token = _current_step.set(context)
    try:
        yield context
    finally:
        _current_step.reset(token)


NewTurnHook = Callable[["AgentTurn"], Mapping[str, str]]
"""Returns the trace context to store in a turn that is being created (empty: none)."""

_new_turn_hooks: WeakKeyDictionary[object, NewTurnHook] = WeakKeyDictionary()


def set_new_turn_hook(runner: object, hook: NewTurnHook | None) -> None:
    """Register `hook` for the turns `runner` creates from now on (None removes it)."""
    if hook is None:
        _new_turn_hooks.pop(runner, None)
    else:
        _new_turn_hooks[runner] = hook


def stamp_new_turn(runner: object, turn: AgentTurn) -> AgentTurn:
    """Return `turn` with the trace context from `runner`'s hook, or `turn` itself without one.

    A hook that raises is logged and ignored: telemetry never stops a turn from being created.
    """
    hook = _new_turn_hooks.get(runner)
    if hook is None:
        return turn
    try:
        context = {str(key): str(value) for key, value in hook(turn).items()}
    except Exception:
        logger.exception("the new-turn telemetry hook raised for turn %s; the turn goes on without it", turn.id)
        return turn
    if not context:
        return turn
    return turn.model_copy(update={"trace_context": context})
