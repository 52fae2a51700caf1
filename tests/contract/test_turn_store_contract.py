"""The `AgentTurnStore` contract, run against the in-memory, SQLite and PostgreSQL stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from agent_runner import (
    ActionStatus,
    AgentConversationBusyException,
    AgentFormDefinition,
    AgentSuspension,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChildLink,
    LeaseLostError,
    PageAction,
    Phase,
    SuspensionType,
    SystemMessage,
    TimeoutAction,
    ToolCall,
    ToolMessage,
    TurnNotFound,
    Usage,
    UserMessage,
    VersionConflictError,
)
from agent_runner.persistence import AgentTurnStore, CachedSnapshots, CancelFlagSource
from tests.contract.conftest import ZONED_BACKENDS


@pytest.fixture(params=ZONED_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend, and PostgreSQL in sessions whose time zone is not UTC: stored times must not depend on it."""
    return str(request.param)


S = AgentTurnStatus
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def make_turn(turn_id: str, *, conversation_id: str | None = None, status: S = S.READY, **fields: object) -> AgentTurn:
    data: dict[str, object] = {
        "id": turn_id,
        "agent_id": "support-agent",
        "root_turn_id": turn_id,
        "conversation_id": conversation_id,
        "status": status,
        "messages": [UserMessage(id=f"{turn_id}-u0", content="hello")],
        "created_at": T0,
        "updated_at": T0,
    }
    data.update(fields)
    return AgentTurn.model_validate(data)


def rich_turn(turn_id: str) -> AgentTurn:
    """A snapshot that uses every part of the model: suspension with a form, calls, children, actions."""
    form = AgentFormDefinition(
        key="support_ticket_details",
        description="Ticket details — «quoted», 日本語 ✓",
        schema={
            "type": "object",
            "properties": {
                "zeta": {"type": "string", "title": "Z comes first"},
                "affected_system": {"type": "string", "enum": ["CRM", "ERP"]},
                "impact_scope": {"type": "string", "enum": ["ONE_USER", "ALL_USERS"]},
            },
            "required": ["affected_system"],
        },
    )
    call = ToolCall(id="call-1", name="request_user_input", arguments={"formKey": "support_ticket_details"})
    second = ToolCall(
        id="call-2",
        name="create_ticket",
        arguments={"affected_system": "CRM", "nested": {"b": [1, 2.5, None], "a": True}},
    )
    return AgentTurn(
        id=turn_id,
        agent_id="support-agent",
        agent_version="7",
        conversation_id=None,
        parent_turn_id="parent-1",
        root_turn_id="root-1",
        status=S.WAITING_FOR_USER,
        phase=Phase.TOOLS,
        messages=[
            SystemMessage(id="m0", content="You help with tickets."),
            UserMessage(id="m1", content="My CRM is down 🔥 — ¿puedes ayudar? \u202eRTL\u202c"),
            AiMessage(id="m2", content=None, tool_calls=[call, second]),
            ToolMessage(id="m3", tool_call_id="call-0", tool_name="lookup", content='{"ok": true}', is_error=True),
        ],
        pending_tool_calls=[call, second],
        suspension=AgentSuspension(
            type=SuspensionType.USER_INPUT,
            correlation_id="call-1",
            message="Please describe the ticket",
            resume_phase=Phase.TOOLS,
            metadata={"source": "model", "attempt": 2, "tags": ["a", "b"]},
            form=form,
            created_at=T0 + timedelta(seconds=5),
        ),
        model_iterations=3,
        steps=5,
        usage=Usage(input_tokens=1234, output_tokens=567, cost=0.0123),
        attempt=1,
        next_retry_at=T0 + timedelta(minutes=5, microseconds=123456),
        cancel_requested=False,
        final_output=None,
        error="previous attempt: TimeoutError",
        created_at=T0,
        updated_at=T0 + timedelta(seconds=7),
        approved_call_ids=["call-0"],
        form_data={"call-9": {"affected_system": "ERP", "count": 3}},
        children=[
            ChildLink(tool_call_id="call-7", agent_id="researcher", child_turn_id="child-1"),
            ChildLink(
                tool_call_id="call-8",
                agent_id="writer",
                child_turn_id="child-2",
                status=S.COMPLETED,
                output="done ✓",
            ),
        ],
        page_actions=[
            PageAction(
                message_id="pm-1",
                action_id="call-1",
                kind="form",
                status=ActionStatus.PENDING,
                synced=True,
                payload={"role": "agent_form", "schema": {"type": "object"}},
            ),
            PageAction(message_id="pm-2", action_id="call-0", kind="approval", status=ActionStatus.APPROVED),
        ],
        projected_count=2,
        lease_fence=4,
    )


def advance(turn: AgentTurn, *, status: S | None = None, add: int = 1, **fields: object) -> AgentTurn:
    """The next snapshot a runner would save: some new messages and a later updated_at."""
    new = [AiMessage(id=f"{turn.id}-a{len(turn.messages) + i}", content=f"step {i}") for i in range(add)]
    update: dict[str, object] = {
        "messages": [*turn.messages, *new],
        "updated_at": turn.updated_at + timedelta(seconds=1),
        "steps": turn.steps + 1,
    }
    if status is not None:
        update["status"] = status
    update.update(fields)
    return turn.model_copy(update=update)


# --- Create, load, compare-and-swap ----------------------------------------------------------


def test_a_rich_turn_round_trips_exactly(turn_store: AgentTurnStore) -> None:
    # Given a snapshot that uses every field, when it is created and loaded back
    turn = rich_turn("rich-1")
    saved = turn_store.save(turn, -1)
    loaded = turn_store.load("rich-1")
    # Then it equals what was saved, field for field and byte for byte in JSON
    assert saved == turn.model_copy(update={"version": 0})
    assert loaded == saved
    assert loaded.model_dump_json() == saved.model_dump_json()
    assert list(loaded.suspension.form.schema["properties"]) == ["zeta", "affected_system", "impact_scope"]  # type: ignore[union-attr]


def test_create_stores_version_zero_and_each_save_adds_one(turn_store: AgentTurnStore) -> None:
    turn = turn_store.save(make_turn("t-1"), -1)
    assert turn.version == 0
    for expected in range(5):
        turn = turn_store.save(advance(turn, status=S.RUNNING), expected)
        assert turn.version == expected + 1
    loaded = turn_store.load("t-1")
    assert loaded == turn
    assert [m.id for m in loaded.messages] == ["t-1-u0", *(f"t-1-a{i}" for i in range(1, 6))]


def test_a_save_with_a_stale_version_is_refused_and_changes_nothing(turn_store: AgentTurnStore) -> None:
    created = turn_store.save(make_turn("t-1"), -1)
    first = turn_store.save(advance(created, status=S.RUNNING), 0)
    # When a second writer saves from the same version 0
    with pytest.raises(VersionConflictError) as raised:
        turn_store.save(advance(created, add=3, status=S.COMPLETED), 0)
    # Then it is told the stored version, and the first writer's snapshot is intact
    assert (raised.value.expected_version, raised.value.actual_version) == (0, 1)
    assert turn_store.load("t-1") == first


def test_creating_a_turn_that_exists_is_a_version_conflict(turn_store: AgentTurnStore) -> None:
    created = turn_store.save(make_turn("t-1"), -1)
    with pytest.raises(VersionConflictError) as raised:
        turn_store.save(advance(created), -1)
    assert raised.value.actual_version == 0
    assert turn_store.load("t-1") == created


def test_saving_an_unknown_turn_with_a_version_is_a_version_conflict(turn_store: AgentTurnStore) -> None:
    with pytest.raises(VersionConflictError) as raised:
        turn_store.save(make_turn("ghost"), 3)
    assert raised.value.actual_version is None
    with pytest.raises(TurnNotFound):
        turn_store.load("ghost")


def test_loading_an_unknown_turn_raises_turn_not_found(turn_store: AgentTurnStore) -> None:
    with pytest.raises(TurnNotFound) as raised:
        turn_store.load("nope")
    assert raised.value.turn_id == "nope"


def test_a_snapshot_without_messages_round_trips(turn_store: AgentTurnStore) -> None:
    saved = turn_store.save(make_turn("empty", messages=[]), -1)
    assert turn_store.load("empty") == saved
    grown = turn_store.save(advance(saved, add=2), 0)
    assert turn_store.load("empty").messages == grown.messages


def test_a_load_returns_the_messages_another_store_appended(
    turn_store: AgentTurnStore, other_turn_store: AgentTurnStore
) -> None:
    # Given a turn this store created and loaded (so it may remember its messages)
    created = turn_store.save(make_turn("t-1"), -1)
    assert turn_store.load("t-1") == created
    # When another store instance (another process) adds messages over several saves
    theirs = other_turn_store.load("t-1")
    for version in range(3):
        theirs = other_turn_store.save(advance(theirs, add=2, status=S.RUNNING), version)
    # Then this store loads the whole history, in order, as the other store saved it
    loaded = turn_store.load("t-1")
    assert loaded == theirs
    assert [m.id for m in loaded.messages] == ["t-1-u0", *(f"t-1-a{i}" for i in range(1, 7))]
    # And its next save and the other store's next load agree on every message
    ours = turn_store.save(advance(loaded, add=1), loaded.version)
    assert other_turn_store.load("t-1") == ours
    assert turn_store.load("t-1") == ours


def test_a_load_returns_a_history_another_store_cut_and_rewrote(
    turn_store: AgentTurnStore, other_turn_store: AgentTurnStore
) -> None:
    # Given a turn of four messages that this store saved
    created = turn_store.save(advance(make_turn("t-1"), add=3), -1)
    # When another store saves it with two messages, then with different ones after them
    shorter = other_turn_store.save(created.model_copy(update={"messages": created.messages[:2]}), 0)
    rewritten = [*shorter.messages, *(AiMessage(id=f"other-{i}", content=f"other {i}") for i in range(3))]
    theirs = other_turn_store.save(shorter.model_copy(update={"messages": rewritten}), 1)
    # Then this store loads what is stored now, not the messages it saved first
    loaded = turn_store.load("t-1")
    assert loaded == theirs
    assert [m.id for m in loaded.messages] == ["t-1-u0", "t-1-a1", "other-0", "other-1", "other-2"]


def test_get_ref_reads_the_header_of_the_stored_turn(turn_store: AgentTurnStore) -> None:
    retry_at = T0 + timedelta(minutes=5)
    created = turn_store.save(make_turn("t-1"), -1)
    saved = turn_store.save(
        advance(created, status=S.RETRY_SCHEDULED, next_retry_at=retry_at, updated_at=T0 + timedelta(minutes=1)), 0
    )
    ref = turn_store.get_ref("t-1")
    assert (ref.turn_id, ref.version, ref.status) == ("t-1", 1, S.RETRY_SCHEDULED)
    assert (ref.updated_at, ref.next_retry_at) == (saved.updated_at, retry_at)
    assert ref.is_runnable(retry_at) and not ref.is_runnable(retry_at - timedelta(seconds=1))
    with pytest.raises(TurnNotFound) as raised:
        turn_store.get_ref("nope")
    assert raised.value.turn_id == "nope"


def test_cancel_requested_among_reads_many_flags_at_once(turn_store: AgentTurnStore) -> None:
    assert isinstance(turn_store, CancelFlagSource)
    for turn_id in ("t-1", "t-2", "t-3"):
        turn_store.save(make_turn(turn_id), -1)
    flagged = turn_store.load("t-2")
    turn_store.save(advance(flagged, cancel_requested=True), flagged.version)
    # Unknown ids are left out; an empty question reads nothing.
    assert turn_store.cancel_requested_among(["t-1", "t-2", "t-3", "nope"]) == {"t-2"}
    assert turn_store.cancel_requested_among(["t-1"]) == set()
    assert turn_store.cancel_requested_among([]) == set()


# --- One active turn per conversation --------------------------------------------------------


def test_a_second_active_turn_of_a_conversation_is_refused(turn_store: AgentTurnStore) -> None:
    first = turn_store.save(make_turn("t-1", conversation_id="c-1"), -1)
    turn_store.save(advance(first, status=S.WAITING_FOR_APPROVAL), 0)
    # When another turn of the same conversation is created
    with pytest.raises(AgentConversationBusyException) as raised:
        turn_store.save(make_turn("t-2", conversation_id="c-1"), -1)
    # Then the error names the conversation and the active turn with its status
    busy = raised.value
    assert (busy.conversation_id, busy.active_turn_id, busy.status) == ("c-1", "t-1", S.WAITING_FOR_APPROVAL)
    with pytest.raises(TurnNotFound):
        turn_store.load("t-2")
    found = turn_store.find_active_turn("c-1")
    assert found is not None and found.id == "t-1"


def test_a_new_turn_may_start_once_the_active_one_ended(turn_store: AgentTurnStore) -> None:
    first = turn_store.save(make_turn("t-1", conversation_id="c-1"), -1)
    turn_store.save(advance(first, status=S.COMPLETED), 0)
    assert turn_store.find_active_turn("c-1") is None
    second = turn_store.save(make_turn("t-2", conversation_id="c-1"), -1)
    assert turn_store.find_active_turn("c-1") == second


def test_terminal_turns_never_block_a_conversation(turn_store: AgentTurnStore) -> None:
    turn_store.save(make_turn("t-1", conversation_id="c-1", status=S.FAILED), -1)
    turn_store.save(make_turn("t-2", conversation_id="c-1", status=S.CANCELLED), -1)
    turn_store.save(make_turn("t-3", conversation_id="c-1"), -1)
    # A terminal turn may also be created while another is active
    turn_store.save(make_turn("t-4", conversation_id="c-1", status=S.COMPLETED), -1)
    found = turn_store.find_active_turn("c-1")
    assert found is not None and found.id == "t-3"


def test_reactivating_an_ended_turn_while_another_is_active_is_refused(turn_store: AgentTurnStore) -> None:
    first = turn_store.save(make_turn("t-1", conversation_id="c-1"), -1)
    ended = turn_store.save(advance(first, status=S.COMPLETED), 0)
    turn_store.save(make_turn("t-2", conversation_id="c-1"), -1)
    with pytest.raises(AgentConversationBusyException) as raised:
        turn_store.save(advance(ended, status=S.RUNNING), 1)
    assert raised.value.active_turn_id == "t-2"
    assert turn_store.load("t-1") == ended


def test_conversations_are_independent_and_children_have_none(turn_store: AgentTurnStore) -> None:
    turn_store.save(make_turn("t-1", conversation_id="c-1"), -1)
    turn_store.save(make_turn("t-2", conversation_id="c-2"), -1)
    turn_store.save(make_turn("child-1", parent_turn_id="t-1", root_turn_id="t-1"), -1)
    turn_store.save(make_turn("child-2", parent_turn_id="t-1", root_turn_id="t-1"), -1)
    assert turn_store.find_active_turn("c-3") is None
    active = turn_store.find_active_turn("c-2")
    assert active is not None and active.id == "t-2"


def test_two_tenants_using_one_conversation_id_never_meet(turn_store: AgentTurnStore) -> None:
    # Given an active turn in conversation c-1 of tenant acme
    turn_store.save(make_turn("t-acme", conversation_id="c-1", tenant_id="acme"), -1)
    # When tenant globex, and a caller without a tenant, start turns in their own c-1
    turn_store.save(make_turn("t-globex", conversation_id="c-1", tenant_id="globex"), -1)
    turn_store.save(make_turn("t-none", conversation_id="c-1"), -1)
    # Then each conversation has its own active turn, and only its own turns are busy with it
    found = {tenant: turn_store.find_active_turn("c-1", tenant) for tenant in ("acme", "globex", None, "other")}
    assert {tenant: None if t is None else t.id for tenant, t in found.items()} == {
        "acme": "t-acme",
        "globex": "t-globex",
        None: "t-none",
        "other": None,
    }
    with pytest.raises(AgentConversationBusyException) as raised:
        turn_store.save(make_turn("t-acme-2", conversation_id="c-1", tenant_id="acme"), -1)
    assert raised.value.active_turn_id == "t-acme"
    listed = turn_store.list_turns(conversation_id="c-1", tenant_id="globex")
    assert [t.id for t in listed] == ["t-globex"]


# --- Cancel flag and lease fence -------------------------------------------------------------


def test_request_cancel_sets_the_flag_without_a_new_version(turn_store: AgentTurnStore) -> None:
    created = turn_store.save(make_turn("t-1"), -1)
    running = turn_store.save(advance(created, status=S.RUNNING), 0)
    flagged = turn_store.request_cancel("t-1")
    assert flagged.cancel_requested is True
    assert flagged.version == running.version == 1
    assert flagged.model_copy(update={"cancel_requested": False}) == running
    assert turn_store.request_cancel("t-1") == flagged


def test_the_cancel_flag_survives_a_save_that_does_not_carry_it(turn_store: AgentTurnStore) -> None:
    created = turn_store.save(make_turn("t-1"), -1)
    turn_store.request_cancel("t-1")
    # A writer that loaded before the flag was set saves with cancel_requested=False
    saved = turn_store.save(advance(created, status=S.RUNNING), 0)
    assert saved.cancel_requested is True
    assert turn_store.load("t-1").cancel_requested is True
    # And a snapshot saying False again cannot clear it
    again = turn_store.save(advance(saved).model_copy(update={"cancel_requested": False}), 1)
    assert again.cancel_requested is True


def test_the_first_cancel_reason_is_kept_and_no_save_forgets_it(
    turn_store: AgentTurnStore, other_turn_store: AgentTurnStore
) -> None:
    # Given a RUNNING turn cancelled with a reason, then again with another one
    created = turn_store.save(make_turn("t-1"), -1)
    running = turn_store.save(advance(created, status=S.RUNNING), 0)
    assert turn_store.request_cancel("t-1", reason="the customer hung up").cancel_reason == "the customer hung up"
    again = turn_store.request_cancel("t-1", reason="a second thought")
    # Then the first reason stays, without a new version
    assert (again.cancel_reason, again.version) == ("the customer hung up", running.version)
    # And a save from a writer that loaded before the request keeps it, in every process
    saved = turn_store.save(advance(running), running.version)
    assert saved.cancel_requested is True
    for reader in (turn_store, other_turn_store):
        assert reader.load("t-1").cancel_reason == "the customer hung up"


def test_a_save_never_changes_the_cancel_reason_the_store_holds(
    turn_store: AgentTurnStore, other_turn_store: AgentTurnStore
) -> None:
    # The reason is written by a cancel request alone: a snapshot that carries another one
    # (or none) saves without touching it, and what the save returns says what is stored.
    created = turn_store.save(make_turn("t-1"), -1)
    running = turn_store.save(advance(created, status=S.RUNNING), 0)
    turn_store.request_cancel("t-1", reason="the customer hung up")
    saved = turn_store.save(advance(running, cancel_reason="made up by a writer"), running.version)
    assert saved.cancel_reason == "the customer hung up"
    for reader in (turn_store, other_turn_store):
        assert reader.load("t-1").cancel_reason == "the customer hung up"
    # A turn no request cancelled keeps no reason either, whatever its snapshot says
    fresh = turn_store.save(make_turn("t-2", cancel_reason="made up"), -1)
    assert fresh.cancel_reason is None and turn_store.load("t-2").cancel_reason is None


def test_a_cancel_request_without_a_reason_stores_none(turn_store: AgentTurnStore) -> None:
    created = turn_store.save(make_turn("t-1"), -1)
    turn_store.save(advance(created, status=S.RUNNING), 0)
    flagged = turn_store.request_cancel("t-1")
    assert (flagged.cancel_requested, flagged.cancel_reason) == (True, None)
    assert turn_store.load("t-1").cancel_reason is None


def test_request_cancel_of_an_unknown_turn_raises_turn_not_found(turn_store: AgentTurnStore) -> None:
    with pytest.raises(TurnNotFound):
        turn_store.request_cancel("nope")


def test_a_save_with_a_lower_fence_is_refused_as_a_lost_lease(turn_store: AgentTurnStore) -> None:
    created = turn_store.save(make_turn("t-1", lease_fence=1), -1)
    taken_over = turn_store.save(advance(created, status=S.RUNNING, lease_fence=2), 0)
    # When the worker of fence 1 wakes up and saves on top of version 1
    with pytest.raises(LeaseLostError) as raised:
        turn_store.save(advance(taken_over, lease_fence=1), 1)
    # Then it is refused, and nothing changed
    assert (raised.value.turn_id, raised.value.fence) == ("t-1", 1)
    assert turn_store.load("t-1") == taken_over


def test_the_fence_never_goes_down(turn_store: AgentTurnStore) -> None:
    created = turn_store.save(make_turn("t-1", lease_fence=3), -1)
    # A save without a fence (a resume from a web request) keeps the stored one
    unfenced = turn_store.save(advance(created, lease_fence=None), 0)
    assert unfenced.lease_fence == 3
    same = turn_store.save(advance(unfenced, lease_fence=3), 1)
    assert same.lease_fence == 3
    higher = turn_store.save(advance(same, lease_fence=9), 2)
    assert higher.lease_fence == 9
    assert turn_store.load("t-1").lease_fence == 9


def test_a_version_conflict_is_reported_before_a_lost_lease(turn_store: AgentTurnStore) -> None:
    created = turn_store.save(make_turn("t-1", lease_fence=5), -1)
    turn_store.save(advance(created), 0)
    with pytest.raises(VersionConflictError):
        turn_store.save(advance(created, lease_fence=1), 0)


# --- Queries ---------------------------------------------------------------------------------


def test_list_turns_filters_and_orders_newest_first(turn_store: AgentTurnStore) -> None:
    for index, (status, conversation, parent) in enumerate(
        [
            (S.COMPLETED, "c-1", None),
            (S.WAITING_FOR_USER, "c-2", None),
            (S.READY, None, "p-1"),
            (S.FAILED, None, "p-1"),
            (S.COMPLETED, "c-1", None),
        ]
    ):
        turn_store.save(
            make_turn(
                f"t-{index}",
                status=status,
                conversation_id=conversation,
                parent_turn_id=parent,
                updated_at=T0 + timedelta(minutes=index),
            ),
            -1,
        )
    ids = [t.id for t in turn_store.list_turns()]
    assert ids == ["t-4", "t-3", "t-2", "t-1", "t-0"]
    assert [t.id for t in turn_store.list_turns(conversation_id="c-1")] == ["t-4", "t-0"]
    assert [t.id for t in turn_store.list_turns(parent_turn_id="p-1")] == ["t-3", "t-2"]
    assert [t.id for t in turn_store.list_turns(statuses=[S.COMPLETED, S.READY])] == ["t-4", "t-2", "t-0"]
    assert [t.id for t in turn_store.list_turns(statuses=[S.FAILED], parent_turn_id="p-1")] == ["t-3"]
    assert [t.id for t in turn_store.list_turns(limit=2)] == ["t-4", "t-3"]
    assert turn_store.list_turns(statuses=[]) == []
    assert turn_store.list_turns(conversation_id="c-1")[0].messages == [UserMessage(id="t-4-u0", content="hello")]


def test_list_runnable_returns_ready_running_and_due_retries_oldest_first(turn_store: AgentTurnStore) -> None:
    now = T0 + timedelta(hours=1)
    cases = {
        "ready": (S.READY, None),
        "running": (S.RUNNING, None),
        "retry-due": (S.RETRY_SCHEDULED, now - timedelta(seconds=1)),
        "retry-now": (S.RETRY_SCHEDULED, now),
        "retry-later": (S.RETRY_SCHEDULED, now + timedelta(seconds=1)),
        "retry-unset": (S.RETRY_SCHEDULED, None),
        "waiting": (S.WAITING_FOR_APPROVAL, None),
        "done": (S.COMPLETED, None),
    }
    for minute, (turn_id, (status, retry_at)) in enumerate(cases.items()):
        turn_store.save(
            make_turn(turn_id, status=status, next_retry_at=retry_at, updated_at=T0 + timedelta(minutes=10 - minute)),
            -1,
        )
    refs = turn_store.list_runnable(now)
    assert [r.turn_id for r in refs] == ["retry-unset", "retry-now", "retry-due", "running", "ready"]
    due = next(r for r in refs if r.turn_id == "retry-due")
    assert (due.version, due.status, due.next_retry_at) == (0, S.RETRY_SCHEDULED, now - timedelta(seconds=1))
    assert due.updated_at == T0 + timedelta(minutes=8)
    assert [r.turn_id for r in turn_store.list_runnable(now, limit=2)] == ["retry-unset", "retry-now"]


def test_a_ready_turn_with_a_start_time_is_runnable_and_due_only_once_it_has_come(turn_store: AgentTurnStore) -> None:
    # Given READY turns whose delayed start is ahead, has come, or was never set
    now = T0 + timedelta(hours=1)
    cases = {
        "start-later": now + timedelta(seconds=1),
        "start-now": now,
        "start-past": now - timedelta(minutes=5),
        "no-start": None,
    }
    for minute, (turn_id, starts_at) in enumerate(cases.items()):
        turn_store.save(make_turn(turn_id, next_retry_at=starts_at, updated_at=T0 + timedelta(minutes=minute)), -1)
    # Then the workers' poll skips the one whose time is ahead
    assert [r.turn_id for r in turn_store.list_runnable(now)] == ["start-now", "start-past", "no-start"]
    assert turn_store.get_ref("start-later").next_retry_at == now + timedelta(seconds=1)
    assert not turn_store.get_ref("start-later").is_runnable(now)
    # And the due sweep lists the delayed starts that came (earliest first), not plain READY turns
    assert [r.turn_id for r in turn_store.list_due_retries(now)] == ["start-past", "start-now"]
    # And a second later the last one is runnable and due too
    later = now + timedelta(seconds=1)
    assert "start-later" in [r.turn_id for r in turn_store.list_runnable(later)]
    assert [r.turn_id for r in turn_store.list_due_retries(later)] == ["start-past", "start-now", "start-later"]


def test_a_ready_turn_waiting_for_its_start_is_idle_only_from_that_start(turn_store: AgentTurnStore) -> None:
    # Given, saved long ago, READY turns starting in a day, a minute ago and long ago, and a plain one
    saved = T0
    cutoff = T0 + timedelta(hours=2)
    cases = {
        "starts-tomorrow": cutoff + timedelta(days=1),
        "started-a-minute-ago": cutoff + timedelta(minutes=-1),
        "started-after-cutoff": cutoff + timedelta(minutes=1),
        "plain": None,
    }
    for minute, (turn_id, starts_at) in enumerate(cases.items()):
        turn_store.save(make_turn(turn_id, next_retry_at=starts_at, updated_at=saved + timedelta(minutes=minute)), -1)
    # Then the stale sweep's listing has the plain turn and the one whose start came before the cutoff
    idle = turn_store.list_idle([S.READY], cutoff)
    assert [r.turn_id for r in idle] == ["started-a-minute-ago", "plain"]
    # And however many turns wait for a later start, they never take the batch's places
    assert [r.turn_id for r in turn_store.list_idle([S.READY], cutoff, limit=1)] == ["started-a-minute-ago"]


def test_list_idle_returns_turns_of_the_given_statuses_not_saved_since_oldest_first(
    turn_store: AgentTurnStore,
) -> None:
    # Given turns in several statuses saved at different times
    turn_store.save(make_turn("ready-old", status=S.READY, updated_at=T0), -1)
    turn_store.save(make_turn("waiting-old", status=S.WAITING_FOR_CHILD, updated_at=T0 + timedelta(minutes=1)), -1)
    turn_store.save(make_turn("running-old", status=S.RUNNING, updated_at=T0 + timedelta(minutes=2)), -1)
    turn_store.save(make_turn("ready-new", status=S.READY, updated_at=T0 + timedelta(hours=2)), -1)
    turn_store.save(make_turn("done-old", status=S.COMPLETED, updated_at=T0 - timedelta(hours=1)), -1)
    cutoff = T0 + timedelta(hours=1)
    # Then only the requested statuses older than the cutoff come back, oldest first
    refs = turn_store.list_idle([S.READY, S.RUNNING], cutoff)
    assert [r.turn_id for r in refs] == ["ready-old", "running-old"]
    assert [r.turn_id for r in turn_store.list_idle([S.WAITING_FOR_CHILD], cutoff)] == ["waiting-old"]
    assert [r.turn_id for r in turn_store.list_idle([S.READY, S.RUNNING], cutoff, limit=1)] == ["ready-old"]
    assert turn_store.list_idle([], cutoff) == []


def test_list_due_retries_returns_only_due_retries_earliest_due_first(turn_store: AgentTurnStore) -> None:
    now = T0 + timedelta(hours=1)
    turn_store.save(make_turn("due-late", status=S.RETRY_SCHEDULED, next_retry_at=now - timedelta(seconds=1)), -1)
    turn_store.save(make_turn("due-early", status=S.RETRY_SCHEDULED, next_retry_at=now - timedelta(minutes=5)), -1)
    turn_store.save(make_turn("not-due", status=S.RETRY_SCHEDULED, next_retry_at=now + timedelta(minutes=5)), -1)
    turn_store.save(make_turn("ready", status=S.READY, updated_at=T0), -1)
    refs = turn_store.list_due_retries(now)
    assert [r.turn_id for r in refs] == ["due-early", "due-late"]
    assert refs[0].next_retry_at == now - timedelta(minutes=5)
    assert [r.turn_id for r in turn_store.list_due_retries(now, limit=1)] == ["due-early"]


def test_timestamps_keep_their_instant_whatever_the_offset(turn_store: AgentTurnStore) -> None:
    paris = datetime(2026, 3, 1, 13, 30, 0, 250000, tzinfo=UTC).astimezone(ZoneInfo("Europe/Paris"))
    saved = turn_store.save(make_turn("tz", updated_at=paris, created_at=paris), -1)
    loaded = turn_store.load("tz")
    assert loaded.updated_at == paris
    assert loaded.created_at == saved.created_at


def _approval_waiting(turn_id: str, deadline: datetime, remind_at: datetime | None = None) -> AgentTurn:
    suspension = AgentSuspension(
        type=SuspensionType.TOOL_APPROVAL,
        correlation_id="c1",
        deadline=deadline,
        on_timeout=TimeoutAction.REJECT,
        remind_at=remind_at,
    )
    return make_turn(
        turn_id,
        status=S.WAITING_FOR_APPROVAL,
        suspension=suspension,
        pending_tool_calls=[ToolCall(id="c1", name="deploy", arguments={})],
    )


def test_list_due_timers_returns_waiting_turns_whose_reminder_or_deadline_came_earliest_first(
    turn_store: AgentTurnStore,
) -> None:
    # Given waiting approvals with deadlines (one with a reminder before it), and turns without any
    now = T0 + timedelta(hours=1)
    list_due_timers = turn_store.list_due_timers  # type: ignore[attr-defined]  # not part of the protocol
    turn_store.save(_approval_waiting("late", now - timedelta(seconds=1)), -1)
    turn_store.save(_approval_waiting("reminder", now + timedelta(hours=1), now - timedelta(minutes=2)), -1)
    turn_store.save(_approval_waiting("early", now - timedelta(minutes=5)), -1)
    turn_store.save(_approval_waiting("future", now + timedelta(minutes=5)), -1)
    turn_store.save(make_turn("ready", status=S.READY), -1)

    # Then those whose reminder or deadline came are listed, earliest wake-up first
    assert [r.turn_id for r in list_due_timers(now)] == ["early", "reminder", "late"]
    assert [r.turn_id for r in list_due_timers(now, limit=1)] == ["early"]

    # And once reminded, a turn wakes up at its deadline; once decided or ended, never
    reminded = turn_store.load("reminder")
    assert reminded.suspension is not None
    sent = reminded.suspension.model_copy(update={"reminded_at": now})
    turn_store.save(reminded.model_copy(update={"suspension": sent}), reminded.version)
    early = turn_store.load("early")
    turn_store.save(early.model_copy(update={"status": S.CANCELLED, "suspension": None}), early.version)
    assert [r.turn_id for r in list_due_timers(now)] == ["late"]
    assert [r.turn_id for r in list_due_timers(now + timedelta(hours=2))] == ["late", "future", "reminder"]


def test_a_store_hands_back_the_snapshot_it_saved_without_reading_it(turn_store: AgentTurnStore) -> None:
    # The optional CachedSnapshots: every store of this project has it
    assert isinstance(turn_store, CachedSnapshots)
    assert turn_store.cached_snapshot("never-saved") is None
    # Given a turn saved, then saved again, through this store
    created = turn_store.save(make_turn("t-cached"), -1)
    assert turn_store.cached_snapshot("t-cached") == created
    running = turn_store.save(created.model_copy(update={"status": S.RUNNING}), created.version)
    # Then the cached snapshot is the newest one it saved
    assert turn_store.cached_snapshot("t-cached") == running
    # And a cancel request through the same store shows in it, at the same version
    turn_store.request_cancel("t-cached", "stop")
    flagged = turn_store.cached_snapshot("t-cached")
    assert flagged is not None and flagged.cancel_requested and flagged.version == running.version


def test_a_save_based_on_a_cached_snapshot_that_went_stale_is_refused(
    turn_store: AgentTurnStore, other_turn_store: AgentTurnStore
) -> None:
    assert isinstance(turn_store, CachedSnapshots)
    created = turn_store.save(make_turn("t-stale"), -1)
    cached = turn_store.cached_snapshot("t-stale")
    assert cached == created
    # Given another process that saved the turn since
    theirs = other_turn_store.save(
        other_turn_store.load("t-stale").model_copy(update={"metadata": {"by": "other"}}), created.version
    )
    # When this store saves a change based on its cached snapshot
    with pytest.raises(VersionConflictError):
        turn_store.save(cached.model_copy(update={"status": S.RUNNING}), cached.version)
    # Then the other process's save stands, and a load brings the cache up to date
    assert turn_store.load("t-stale") == theirs
    assert turn_store.cached_snapshot("t-stale") == theirs
