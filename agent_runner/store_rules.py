"""The rules every turn store, event log, live event channel and chat memory follows, in one place.

This is the contract for the author of an `AgentTurnStore` (and of its `EventLog`,
`LiveEventChannel` or `ChatMemory`) beyond the method signatures in
`agent_runner.persistence`. The in-memory backends (`agent_runner.in_memory`) and the
durable ones (`store`) apply exactly these functions; a third-party store should too, and
must pass the contract tests in `tests/contract/`.

Saving a snapshot (`AgentTurnStore.save`):

- A save is a compare-and-swap on `version`: it succeeds only over the stored version
  `expected_version` (-1: the turn must not exist yet), else `VersionConflictError`.
- `check_fence`: a snapshot whose lease fence is lower than the stored one is refused with
  `LeaseLostError` (a worker whose lease was taken over must not write).
- `saved_snapshot` / `stored_snapshot`: what the store keeps and returns. The version
  advances by one; `cancel_requested` is the stored flag or'ed with the snapshot's (a
  cancel request made while a step ran is never lost), the first `cancel_reason` is kept,
  and the lease fence never goes down. A store that reads the stored values back from its
  own write (an SQL `RETURNING`) passes them to `saved_snapshot`, or the row to `stored_snapshot`.
- A conversation has at most one non-terminal turn (`AgentConversationBusyException`).

Storing events (`EventLog`):

- `kept_events` / `stored_event`: a save keeps its durable events only, once per event id,
  in order, without the cursor they were read at, filed under the turn's tree and under
  its conversation (a child turn's, its root's conversation): `event_scopes`.
- Each tree and each conversation numbers its events 1, 2, 3, ... in the order their saves
  commit; an event's cursor is its position in the scope it was read from.
- `prunable`: pruning removes whole trees only, once every turn in them ended and none was
  saved since the limit.

Live events (`LiveEventChannel`): `live_scopes` says which scopes an event is published to.

Chat memory (`ChatMemory.get_model_messages`): `model_window` is the model's view.
`page_message` and `page_message_update` say what a turn's page action (approval card or
form) writes into its conversation's ChatMemory: the message when it is missing, else
the stored one with the action's state, replaced by compare-and-swap on its version.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol

from agent_runner.errors import LeaseLostError
from agent_runner.events import AgentEvent
from agent_runner.messages import (
    ActionStatus,
    AgentActionMessage,
    AgentFormMessage,
    AnyMessage,
    ModelMessage,
    ToolMessage,
)
from agent_runner.persistence import EventScope
from agent_runner.snapshot import AgentTurn, PageAction

__all__ = [
    "StoredValues",
    "check_fence",
    "event_scopes",
    "kept_events",
    "live_scopes",
    "model_window",
    "page_message",
    "page_message_update",
    "prunable",
    "saved_snapshot",
    "stored_event",
    "stored_snapshot",
]


def check_fence(turn: AgentTurn, stored_fence: int | None) -> None:
    """Refuse a save whose lease fence is lower than the stored one.

    Raises:
        LeaseLostError: `turn.lease_fence` is below `stored_fence`.
    """
    if turn.lease_fence is not None and stored_fence is not None and turn.lease_fence < stored_fence:
        raise LeaseLostError(turn.id, turn.lease_fence)


def saved_snapshot(
    turn: AgentTurn,
    expected_version: int,
    *,
    cancel_requested: bool,
    cancel_reason: str | None,
    lease_fence: int | None,
) -> AgentTurn:
    """Return what a store keeps for a successful save of `turn` over a stored version with these values.

    The version advances by one, the cancel flag is or'ed with the stored one (it never
    goes back to False), the cancel reason is the stored one (a cancel request alone
    writes it, so the first is kept; a snapshot's own reason is never saved), and the
    lease fence never goes down. The keyword arguments are the stored turn's (False, None, None for a new turn);
    values read back after the write, already merged, give the same result.
    """
    cancel = turn.cancel_requested or cancel_requested
    reason = cancel_reason
    # A snapshot without a fence keeps the stored one; a lower one never gets here (the
    # save's fence guard refuses it first).
    fence = turn.lease_fence if turn.lease_fence is not None else lease_fence
    update: dict[str, object] = {"version": expected_version + 1}
    if cancel != turn.cancel_requested:
        update["cancel_requested"] = cancel
    if reason != turn.cancel_reason:
        update["cancel_reason"] = reason
    if fence != turn.lease_fence:
        update["lease_fence"] = fence
    return turn.model_copy(update=update)


class StoredValues(Protocol):
    """The stored values a save merges with its snapshot's: a stored `AgentTurn`, or a row read back."""

    @property
    def cancel_requested(self) -> bool:
        """The stored cancel flag."""
        ...

    @property
    def cancel_reason(self) -> str | None:
        """The stored cancel reason."""
        ...

    @property
    def lease_fence(self) -> int | None:
        """The stored lease fence."""
        ...


def stored_snapshot(turn: AgentTurn, current: StoredValues | None, expected_version: int) -> AgentTurn:
    """Return what a store keeps for a successful save of `turn` over the stored values `current` (None: new)."""
    if current is None:
        return saved_snapshot(turn, expected_version, cancel_requested=False, cancel_reason=None, lease_fence=None)
    return saved_snapshot(
        turn,
        expected_version,
        cancel_requested=current.cancel_requested,
        cancel_reason=current.cancel_reason,
        lease_fence=current.lease_fence,
    )


def stored_event(event: AgentEvent, turn: AgentTurn, root_conversation_id: str | None) -> AgentEvent:
    """Return the event as an event log keeps it, saved with `turn`.

    The event is filed under the turn's tree. Its conversation is its own, else the
    turn's; a child turn has no conversation of its own, so its events are filed under its
    root's (`root_conversation_id`). The cursor it was read at is dropped.
    """
    update: dict[str, object] = {}
    if event.cursor is not None:
        update["cursor"] = None
    if event.root_turn_id != turn.root_turn_id:
        update["root_turn_id"] = turn.root_turn_id
    if event.conversation_id is None and (turn.conversation_id or root_conversation_id) is not None:
        update["conversation_id"] = turn.conversation_id or root_conversation_id
    if event.tenant_id != turn.tenant_id:
        update["tenant_id"] = turn.tenant_id
    # Events come from the runner already filed this way: most need no copy.
    return event.model_copy(update=update) if update else event


def kept_events(turn: AgentTurn, events: Sequence[AgentEvent], root_conversation_id: str | None) -> list[AgentEvent]:
    """The event log's copies (`stored_event`) of the durable events among `events`, once per event id, in order.

    An id stored by an earlier save is skipped by the store itself (its log knows them).
    """
    kept: list[AgentEvent] = []
    seen: set[str] = set()
    for event in events:
        if not event.type.is_durable or event.event_id in seen:
            continue
        seen.add(event.event_id)
        kept.append(stored_event(event, turn, root_conversation_id))
    return kept


def prunable(turns: Iterable[AgentTurn], cutoff: datetime) -> set[str]:
    """Return the ids of the stored root turns whose whole tree ended and was last saved before `cutoff`."""
    trees: dict[str, bool] = {}
    roots: set[str] = set()
    for turn in turns:
        old_and_ended = turn.status.is_terminal and turn.updated_at < cutoff
        trees[turn.root_turn_id] = trees.get(turn.root_turn_id, True) and old_and_ended
        if turn.id == turn.root_turn_id:
            roots.add(turn.id)
    return {root for root, prune in trees.items() if prune and root in roots}


def live_scopes(event: AgentEvent) -> tuple[EventScope, ...]:
    """Return the scopes a live event is published to: its turn tree, and its conversation if any."""
    return event_scopes(event.root_turn_id or event.turn_id, event.conversation_id, event.tenant_id)


@lru_cache(maxsize=4096)
def event_scopes(
    root_turn_id: str, conversation_id: str | None, tenant_id: str | None = None
) -> tuple[EventScope, ...]:
    """Return the scopes of an event of the tree `root_turn_id`: the tree, and the conversation unless None.

    `tenant_id` is the conversation's tenant.

    Every saved or published event needs its scopes; the ones of the trees running now are
    kept, so a step pays a lookup rather than building and checking them again.
    """
    tree = EventScope.tree(root_turn_id)
    return (tree,) if conversation_id is None else (tree, EventScope.conversation(conversation_id, tenant_id))


def model_window(messages: Sequence[AnyMessage], count: int) -> list[ModelMessage]:
    """Return the newest `count` model-visible messages, oldest first, without a leading orphan ToolMessage."""
    window: list[ModelMessage] = []
    if count <= 0:
        return window
    for message in reversed(messages):
        if message.model_visible:
            window.append(message)  # type: ignore[arg-type]  # model_visible implies a model message
            if len(window) == count:
                break
    window.reverse()
    start = 0
    while start < len(window) and isinstance(window[start], ToolMessage):
        start += 1
    return window[start:]


def page_message(payload: dict[str, Any], status: ActionStatus, decision: dict[str, Any] | None = None) -> AnyMessage:
    """The page message (approval card or form) a page action stands for, in the given state."""
    data = {**payload, "status": status, **(decision or {})}
    if payload.get("role") == "agent_form":
        return AgentFormMessage.model_validate(data)
    return AgentActionMessage.model_validate(data)


def page_message_update(stored: AnyMessage, action: PageAction) -> AgentActionMessage | AgentFormMessage | None:
    """The stored page message with the action's status and decision, or None when there is nothing to change.

    A form that is pending again takes the action's form too (a tool asked its next question).

    Every other field stays as stored (a concurrent edit is kept), so the result replaces
    `stored` by compare-and-swap on `stored.version` only. None when `stored` already shows
    the action's state, or is not a page message.
    """
    if not isinstance(stored, AgentActionMessage | AgentFormMessage):
        return None
    data = {**stored.model_dump(mode="json", by_alias=True), "status": action.status, **action.decision}
    if isinstance(stored, AgentFormMessage) and action.status is ActionStatus.PENDING:
        # A tool asking the next question on the same call (an MCP server's second form):
        # the card shows that form, undecided.
        data.update({k: action.payload[k] for k in ("form_key", "description", "schema") if k in action.payload})
        data.update({"decided_by": None, "decided_at": None, "reason": None})
    updated = type(stored).model_validate(data)
    return None if updated == stored else updated
