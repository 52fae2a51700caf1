"""The rules every store applies to a save (`agent_runner.store_rules`), held directly.

The contract suites run them through each backend; a backend that de-duplicates or merges
on its own would hide a rule that broke, so the rules are pinned here as well.
"""

from __future__ import annotations

from agent_runner import AgentEvent, AgentEventType, AgentTurn
from agent_runner.messages import ActionStatus, AgentFormMessage
from agent_runner.snapshot import PageAction
from agent_runner.store_rules import kept_events, page_message_update, saved_snapshot

E = AgentEventType


def _event(event_id: str, type: AgentEventType = E.MODEL_RESPONSE, **data: object) -> AgentEvent:
    return AgentEvent(event_id=event_id, type=type, turn_id="t", root_turn_id="t", data=dict(data))


def test_a_save_keeps_each_durable_event_once_in_order_and_no_ephemeral_one() -> None:
    turn = AgentTurn(id="t", agent_id="a", root_turn_id="t", conversation_id="c-1")
    events = [
        _event("e-1", n=1),
        _event("d-1", E.MODEL_DELTA),
        _event("e-2"),
        _event("e-1", n=2),  # the same id again in the same save: the first copy is kept
    ]
    kept = kept_events(turn, events, None)
    assert [(e.event_id, e.data) for e in kept] == [("e-1", {"n": 1}), ("e-2", {})]
    assert {e.conversation_id for e in kept} == {"c-1"}


def test_a_saved_snapshot_takes_the_stored_cancel_values_and_fence() -> None:
    turn = AgentTurn(id="t", agent_id="a", root_turn_id="t", cancel_reason="the writer's", lease_fence=None)
    saved = saved_snapshot(turn, 4, cancel_requested=True, cancel_reason="the request's", lease_fence=7)
    assert (saved.version, saved.cancel_requested, saved.cancel_reason, saved.lease_fence) == (
        5,
        True,
        "the request's",
        7,
    )
    fenced = turn.model_copy(update={"lease_fence": 9, "cancel_requested": True})
    again = saved_snapshot(fenced, 5, cancel_requested=False, cancel_reason=None, lease_fence=7)
    assert (again.cancel_requested, again.cancel_reason, again.lease_fence) == (True, None, 9)


def test_a_form_pending_again_on_the_same_call_shows_its_new_question_undecided() -> None:
    first = {"role": "agent_form", "id": "t-action-c1", "turn_id": "t", "action_id": "c1", "form_key": "where"}
    stored = AgentFormMessage.model_validate(
        {
            **first,
            "version": 3,
            "description": "Where to?",
            "schema": {"type": "object"},
            "status": "SUBMITTED",
            "decided_by": "ann",
            "decided_at": "2026-12-07T10:00:00Z",
        }
    )
    second = {**first, "form_key": "nights", "description": "How many nights?", "schema": {"type": "object", "x": 1}}
    action = PageAction(message_id="t-action-c1", action_id="c1", kind="form", payload=second)

    updated = page_message_update(stored, action)

    assert isinstance(updated, AgentFormMessage) and updated.version == 3
    assert (updated.form_key, updated.description, updated.schema) == ("nights", "How many nights?", second["schema"])
    assert (updated.status, updated.decided_by, updated.decided_at) == (ActionStatus.PENDING, None, None)
