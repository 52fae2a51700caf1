"""The cancel request of a RUNNING turn and its reason, over stores that may predate the reason.

A RUNNING turn is not ended by the caller: its store only records the request (the flag
and the reason), and the thread stepping the turn, in this process or any other, ends it
at its next boundary. That thread usually holds the snapshot its own last save returned,
which carries the flag but not the reason (a save does not read the reason back), so it
reads the reason from the store once, when it ends the turn.
"""

from __future__ import annotations

import inspect

from agent_runner.errors import AgentRunnerError
from agent_runner.persistence import AgentTurnStore
from agent_runner.snapshot import AgentTurn


def request_cancel(store: AgentTurnStore, turn_id: str, reason: str | None) -> AgentTurn:
    """Flag the turn for cancelling with `reason`; a store that takes no reason gets the flag alone."""
    if reason is not None and _takes_reason(store):
        return store.request_cancel(turn_id, reason=reason)
    return store.request_cancel(turn_id)


def stored_cancel_reason(store: AgentTurnStore, turn: AgentTurn) -> str | None:
    """The reason stored with the turn's cancel request, or None (none given, or the store is unreachable)."""
    if turn.cancel_reason is not None:
        return turn.cancel_reason
    try:
        return store.load(turn.id).cancel_reason
    except AgentRunnerError:
        return None  # the turn still ends, with the policy's reason


def _takes_reason(store: AgentTurnStore) -> bool:
    try:
        parameters = inspect.signature(store.request_cancel).parameters.values()
    except (TypeError, ValueError):
        return False  # no signature to read (a builtin): call it as the oldest protocol did
    return any(p.name == "reason" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
