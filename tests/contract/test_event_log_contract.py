"""The event log of the turn stores (save with events, read_events, prune), against in-memory, SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_runner import (
    AgentConversationBusyException,
    AgentEvent,
    AgentEventType,
    AgentTurn,
    AgentTurnStatus,
    EventFeed,
    InMemoryLiveEvents,
    InvalidCursorError,
    InvalidEventQueryError,
    LeaseLostError,
    TurnNotFound,
    UserMessage,
    VersionConflictError,
)
from agent_runner.persistence import AgentTurnStore, EventLog, EventScope

S = AgentTurnStatus
E = AgentEventType
LONG_AGO = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def make_turn(
    turn_id: str,
    *,
    root: str | None = None,
    conversation_id: str | None = None,
    status: S = S.READY,
    updated_at: datetime | None = None,
    **fields: Any,
) -> AgentTurn:
    when = updated_at or datetime.now(UTC)
    return AgentTurn(
        id=turn_id,
        agent_id="agent",
        root_turn_id=root or turn_id,
        parent_turn_id=None if root is None else root,
        conversation_id=conversation_id,
        status=status,
        messages=[UserMessage(id=f"{turn_id}-u0", content="hello")],
        created_at=when,
        updated_at=when,
        **fields,
    )


def event(turn: AgentTurn, n: int, type: E = E.TURN_STARTED, **fields: Any) -> AgentEvent:
    """The n-th event of the save that takes `turn` to its next version, with the runner's id scheme."""
    return AgentEvent(
        event_id=f"{turn.id}:{turn.version + 1}:{n}",
        type=type,
        turn_id=turn.id,
        root_turn_id=turn.root_turn_id,
        data={"n": n},
        **fields,
    )


def log_of(store: AgentTurnStore) -> EventLog:
    assert isinstance(store, EventLog)
    return store


def ids(events: list[AgentEvent]) -> list[str]:
    return [e.event_id for e in events]


def advance(store: AgentTurnStore, turn: AgentTurn, *types: E, **update: Any) -> tuple[AgentTurn, list[AgentEvent]]:
    """Save the next version of `turn` with one event per type; return the stored turn and the events."""
    events = [event(turn, n, t) for n, t in enumerate(types)]
    return store.save(turn.model_copy(update=update), turn.version, events), events


# --- Saving with events ---------------------------------------------------------------------------


def test_durable_events_are_stored_with_the_save_in_order_and_ephemeral_ones_are_not(
    turn_store: AgentTurnStore,
) -> None:
    root = make_turn("r-1", conversation_id="c-1")
    # Given a creation and two updates, each saved with events of several types
    first = [event(root, 0), event(root, 1, E.MODEL_DELTA), event(root, 2, E.TOOL_PROGRESS)]
    root = turn_store.save(root, -1, first)
    root, second = advance(turn_store, root, E.MODEL_RESPONSE, E.MODEL_DELTA, E.TOOL_STARTED)
    root, third = advance(turn_store, root, E.TOOL_COMPLETED, E.TURN_COMPLETED, status=S.COMPLETED)
    # Then a read of the tree and of the conversation returns the durable ones, in save order
    expected = [first[0].event_id, second[0].event_id, second[2].event_id, third[0].event_id, third[1].event_id]
    by_root = log_of(turn_store).read_events(EventScope.tree("r-1"))
    assert ids(by_root) == expected
    assert ids(log_of(turn_store).read_events(EventScope.conversation("c-1"))) == expected
    # And each comes back as saved, with a cursor and the tree and conversation filled in
    stored = by_root[1]
    assert stored.model_copy(update={"cursor": None}) == second[0].model_copy(update={"conversation_id": "c-1"})
    assert all(e.cursor for e in by_root) and len({e.cursor for e in by_root}) == len(by_root)
    assert all((e.root_turn_id, e.conversation_id) == ("r-1", "c-1") for e in by_root)


def test_a_save_without_events_stores_none(turn_store: AgentTurnStore) -> None:
    root = turn_store.save(make_turn("r-1"), -1)
    root = turn_store.save(root.model_copy(update={"status": S.RUNNING}), 0)
    # Only the event of a later save shows up
    advance(turn_store, root, E.MODEL_RESPONSE)
    assert ids(log_of(turn_store).read_events(EventScope.tree("r-1"))) == ["r-1:2:0"]


def test_a_version_conflict_writes_no_event(turn_store: AgentTurnStore) -> None:
    root = turn_store.save(make_turn("r-1"), -1, [event(make_turn("r-1"), 0)])
    advance(turn_store, root, E.MODEL_RESPONSE)
    # When a stale writer saves at the old version, and a creator re-creates the turn
    with pytest.raises(VersionConflictError):
        turn_store.save(root, 0, [AgentEvent(event_id="stale-1", type=E.TURN_FAILED, turn_id="r-1")])
    with pytest.raises(VersionConflictError):
        turn_store.save(make_turn("r-1"), -1, [AgentEvent(event_id="stale-2", type=E.TURN_STARTED, turn_id="r-1")])
    # Then neither of their events was written
    assert ids(log_of(turn_store).read_events(EventScope.tree("r-1"))) == ["r-1:0:0", "r-1:1:0"]


def test_a_refused_save_writes_no_event(turn_store: AgentTurnStore) -> None:
    # Given a conversation with an active turn, and a turn saved under lease fence 5
    busy = turn_store.save(make_turn("busy", conversation_id="c-1"), -1)
    fenced = turn_store.save(make_turn("fenced", lease_fence=5), -1)
    # When a second active turn is created in the conversation, and a writer with fence 4 saves
    with pytest.raises(AgentConversationBusyException):
        turn_store.save(make_turn("second", conversation_id="c-1"), -1, [event(make_turn("second"), 0)])
    with pytest.raises(LeaseLostError):
        turn_store.save(fenced.model_copy(update={"lease_fence": 4}), 0, [event(fenced, 0)])
    # Then no event of theirs exists: only the events of later successful saves show up
    advance(turn_store, busy, E.TURN_SUSPENDED)
    advance(turn_store, fenced, E.TURN_SUSPENDED)
    log = log_of(turn_store)
    assert ids(log.read_events(EventScope.conversation("c-1"))) == ["busy:1:0"]
    assert ids(log.read_events(EventScope.tree("fenced"))) == ["fenced:1:0"]
    assert log.read_events(EventScope.tree("second")) == []


def test_a_repeated_event_id_is_stored_once(turn_store: AgentTurnStore) -> None:
    root = make_turn("r-1")
    started = event(root, 0)
    root = turn_store.save(root, -1, [started, started])
    # When a later save carries an event id that is already stored, next to a new one
    again = started.model_copy(update={"data": {"second": True}})
    fresh = event(root, 1, E.MODEL_RESPONSE)
    root = turn_store.save(root.model_copy(update={"status": S.RUNNING}), 0, [again, fresh])
    # Then the save succeeds, the first copy stays and the new event is added once
    assert root.version == 1
    stored = log_of(turn_store).read_events(EventScope.tree("r-1"))
    assert ids(stored) == [started.event_id, fresh.event_id]
    assert stored[0].data == {"n": 0}


def test_child_events_are_filed_under_the_tree_and_the_roots_conversation(
    turn_store: AgentTurnStore, other_turn_store: AgentTurnStore
) -> None:
    root = turn_store.save(make_turn("r-1", conversation_id="c-1"), -1, [event(make_turn("r-1"), 0)])
    # Given child turns (no conversation of their own) saved by another store, one with events
    # that name the root's conversation, as runners send them, and one with events that do not
    child_a = make_turn("r-1.a", root="r-1")
    other_turn_store.save(child_a, -1, [event(child_a, 0, conversation_id="c-1")])
    child_b = other_turn_store.save(make_turn("r-1.b", root="r-1"), -1, [event(make_turn("r-1.b", root="r-1"), 0)])
    advance(other_turn_store, child_b, E.MODEL_RESPONSE)
    advance(turn_store, root, E.TURN_SUSPENDED)
    # Then both the tree and the conversation hold every event, in commit order
    expected = ["r-1:0:0", "r-1.a:0:0", "r-1.b:0:0", "r-1.b:1:0", "r-1:1:0"]
    for scope in (EventScope.tree("r-1"), EventScope.conversation("c-1")):
        events = log_of(turn_store).read_events(scope)
        assert ids(events) == expected
        assert {e.conversation_id for e in events} == {"c-1"}
        assert {e.root_turn_id for e in events} == {"r-1"}
    # And a child read by its own id is not a tree
    assert log_of(turn_store).read_events(EventScope.tree("r-1.a")) == []


def test_conversations_and_trees_are_kept_apart(turn_store: AgentTurnStore) -> None:
    for turn_id, conversation in (("r-1", "c-1"), ("r-2", "c-2"), ("r-3", None)):
        turn_store.save(make_turn(turn_id, conversation_id=conversation), -1, [event(make_turn(turn_id), 0)])
    log = log_of(turn_store)
    assert ids(log.read_events(EventScope.conversation("c-1"))) == ["r-1:0:0"]
    assert ids(log.read_events(EventScope.conversation("c-2"))) == ["r-2:0:0"]
    assert ids(log.read_events(EventScope.tree("r-3"))) == ["r-3:0:0"]
    assert log.read_events(EventScope.conversation("unknown")) == []


def test_two_tenants_using_one_conversation_id_have_their_own_log(turn_store: AgentTurnStore) -> None:
    # Given turns of two tenants, and of none, in conversations named c-1, each with an event
    for turn_id, tenant in (("r-a", "acme"), ("r-g", "globex"), ("r-n", None)):
        turn = make_turn(turn_id, conversation_id="c-1", tenant_id=tenant)
        turn_store.save(turn, -1, [event(turn, 0)])
    # Then each conversation numbers its own events from 1, and reads only its own
    log = log_of(turn_store)
    for turn_id, tenant in (("r-a", "acme"), ("r-g", "globex"), ("r-n", None)):
        read = log.read_events(EventScope.conversation("c-1", tenant))
        assert [(e.event_id, e.cursor, e.tenant_id) for e in read] == [(f"{turn_id}:0:0", "1", tenant)]
    assert log.read_events(EventScope.conversation("c-1", "other")) == []


# --- Reading with cursors -------------------------------------------------------------------------


def saved_history(store: AgentTurnStore, turns: int = 3, saves: int = 4) -> list[str]:
    """Save `turns` turns of one tree in one conversation, interleaved, each with events; return their ids."""
    root = make_turn("r-1", conversation_id="c-1")
    members = [store.save(root, -1, [event(root, 0), event(root, 1, E.MODEL_RESPONSE)])]
    for index in range(1, turns):
        child = make_turn(f"r-1.{index}", root="r-1")
        members.append(store.save(child, -1, [event(child, 0, conversation_id="c-1")]))
    for step in range(saves):
        for index, member in enumerate(members):
            extra = {"conversation_id": "c-1"} if index else {}
            events = [event(member, n, E.TOOL_COMPLETED, **extra) for n in range(step % 3)]
            members[index] = store.save(member.model_copy(update={"steps": step}), member.version, events)
    return ids(log_of(store).read_events(EventScope.tree("r-1"), limit=10_000))


@pytest.mark.parametrize(
    "scope", [EventScope.tree("r-1"), EventScope.conversation("c-1")], ids=["tree", "conversation"]
)
def test_reading_after_any_cursor_returns_exactly_the_rest(turn_store: AgentTurnStore, scope: EventScope) -> None:
    everything = saved_history(turn_store)
    log = log_of(turn_store)
    events = log.read_events(scope, limit=10_000)
    assert ids(events) == everything and len(everything) == len(set(everything)) == 13
    # After each event's cursor comes exactly the suffix that follows it
    for index, read in enumerate(events):
        assert ids(log.read_events(scope, after=read.cursor, limit=10_000)) == everything[index + 1 :]
    # And paging with a small limit walks the same sequence once
    paged: list[str] = []
    cursor = None
    while True:
        page = log.read_events(scope, after=cursor, limit=4)
        assert len(page) <= 4
        if not page:
            break
        paged += ids(page)
        cursor = page[-1].cursor
    assert paged == everything


def test_a_cursor_keeps_its_place_as_events_are_added(turn_store: AgentTurnStore) -> None:
    root = turn_store.save(make_turn("r-1"), -1, [event(make_turn("r-1"), 0)])
    log = log_of(turn_store)
    cursor = log.read_events(EventScope.tree("r-1"))[-1].cursor
    assert log.read_events(EventScope.tree("r-1"), after=cursor) == []
    advance(turn_store, root, E.MODEL_RESPONSE, E.TOOL_STARTED)
    added = log.read_events(EventScope.tree("r-1"), after=cursor)
    assert ids(added) == ["r-1:1:0", "r-1:1:1"]
    assert log.read_events(EventScope.tree("r-1"), after=cursor, limit=0) == []


@pytest.mark.parametrize("cursor", ["", "abc", "-1", "1.2.3", "1 ", "١", "99999999999999999999999", "1:2", "0.x"])
def test_a_cursor_the_log_did_not_issue_is_refused(turn_store: AgentTurnStore, cursor: str) -> None:
    turn_store.save(make_turn("r-1"), -1, [event(make_turn("r-1"), 0)])
    with pytest.raises(InvalidCursorError) as raised:
        log_of(turn_store).read_events(EventScope.tree("r-1"), after=cursor)
    assert isinstance(raised.value, InvalidEventQueryError) and raised.value.cursor == cursor


def test_concurrent_writers_lose_no_event_for_a_polling_reader(
    turn_store: AgentTurnStore, database_url: str | None
) -> None:
    """Several children of one tree save at once while a reader follows with its cursor."""
    import store as sql

    writers, saves_each = 4, 6
    turn_store.save(make_turn("r-1", conversation_id="c-1"), -1, [event(make_turn("r-1"), 0)])
    expected = {"r-1:0:0"}
    errors: list[BaseException] = []

    def write(index: int) -> None:
        own = turn_store if database_url is None else sql.SqlAgentTurnStore(database_url)
        try:
            child = make_turn(f"r-1.{index}", root="r-1")
            child = own.save(child, -1, [event(child, 0, conversation_id="c-1")])
            for step in range(saves_each):
                events = [event(child, n, E.TOOL_COMPLETED, conversation_id="c-1") for n in range(2)]
                child = own.save(child.model_copy(update={"steps": step}), child.version, events)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            if isinstance(own, sql.SqlAgentTurnStore) and own is not turn_store:
                own.close()  # a store of this thread's own: close its pool

    for index in range(writers):
        expected.add(f"r-1.{index}:0:0")
        expected.update(f"r-1.{index}:{version}:{n}" for version in range(1, saves_each + 1) for n in range(2))
    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    scopes = (EventScope.tree("r-1"), EventScope.conversation("c-1"))
    seen: dict[EventScope, list[str]] = {scope: [] for scope in scopes}
    cursors: dict[EventScope, str | None] = {scope: None for scope in scopes}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(len(s) >= len(expected) for s in seen.values()):
        for scope in scopes:
            page = log_of(turn_store).read_events(scope, after=cursors[scope], limit=7)
            if page:
                seen[scope] += ids(page)
                cursors[scope] = page[-1].cursor
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    for key, found in seen.items():
        assert sorted(found) == sorted(expected), key
        # Each turn's events come in the order its saves committed
        for index in range(writers):
            own = [i for i in found if i.startswith(f"r-1.{index}:")]
            assert own == sorted(own, key=lambda i: tuple(int(p) for p in i.split(":")[1:]))


# --- The feed over each log -------------------------------------------------------------------


def test_an_event_feed_over_the_log_merges_live_deltas_and_resumes(turn_store: AgentTurnStore) -> None:
    live = InMemoryLiveEvents()
    feed = EventFeed(log_of(turn_store), live)
    root = make_turn("r-1", conversation_id="c-1")
    started = event(root, 0, conversation_id="c-1")
    root = turn_store.save(root, -1, [started])
    live.publish(started)  # the wake-up a runner sends after the save
    delta = AgentEvent(type=E.MODEL_DELTA, turn_id="r-1", root_turn_id="r-1", conversation_id="c-1", data={"t": "Hi"})
    live.publish(delta)
    root, (answer,) = advance(turn_store, root, E.MODEL_RESPONSE)
    live.publish(answer)
    events = feed.read(EventScope.conversation("c-1"))
    assert ids(events) == [started.event_id, delta.event_id, answer.event_id]
    assert ids(feed.read(EventScope.conversation("c-1"), after=events[0].cursor)) == [delta.event_id, answer.event_id]
    assert feed.read(EventScope.conversation("c-1"), after=events[-1].cursor) == []


# --- Retention ------------------------------------------------------------------------------------


def prunable_store(store: AgentTurnStore) -> Any:
    assert hasattr(store, "prune")
    return store


def stored_ids(store: AgentTurnStore) -> set[str]:
    return {t.id for t in store.list_turns(limit=1000)}


def test_prune_removes_old_ended_trees_with_their_events_and_keeps_the_rest(turn_store: AgentTurnStore) -> None:
    old, recent = LONG_AGO, datetime.now(UTC)
    # Given ended trees from long ago (one with children), an old tree with a child still
    # waiting, an old active turn, and a tree that ended a moment ago
    plan: list[tuple[str, str | None, S, datetime]] = [
        ("done-1", None, S.COMPLETED, old),
        ("done-1.a", "done-1", S.COMPLETED, old),
        ("done-1.b", "done-1", S.FAILED, old),
        ("done-2", None, S.CANCELLED, old),
        ("mixed", None, S.COMPLETED, old),
        ("mixed.a", "mixed", S.WAITING_FOR_USER, old),
        ("waiting", None, S.WAITING_FOR_APPROVAL, old),
        ("fresh", None, S.COMPLETED, recent),
        ("late-child", None, S.COMPLETED, old),
        ("late-child.a", "late-child", S.COMPLETED, recent),
    ]
    plan += [(f"bulk-{i}", None, S.COMPLETED, old) for i in range(7)]
    for turn_id, root, status, when in plan:
        turn = make_turn(turn_id, root=root, status=status, updated_at=when, conversation_id=None)
        turn_store.save(turn, -1, [event(turn, 0, E.TURN_COMPLETED)])
    # When turns that ended more than a day ago are pruned, three trees per batch
    removed = prunable_store(turn_store).prune(timedelta(days=1), batch_size=3)
    # Then the old ended trees are gone with their events, and everything else stays
    gone = {"done-1", "done-1.a", "done-1.b", "done-2"} | {f"bulk-{i}" for i in range(7)}
    assert removed == len(gone)
    assert stored_ids(turn_store) == {p[0] for p in plan} - gone
    for turn_id in gone:
        with pytest.raises(TurnNotFound):
            turn_store.load(turn_id)
    log = log_of(turn_store)
    assert ids(log.read_events(EventScope.tree("mixed"))) == ["mixed:0:0", "mixed.a:0:0"]
    assert log.read_events(EventScope.tree("done-1")) == []
    assert turn_store.load("mixed.a").messages[0].content == "hello"
    assert ids(log.read_events(EventScope.tree("late-child"))) == ["late-child:0:0", "late-child.a:0:0"]
    # And pruning again finds nothing more
    assert prunable_store(turn_store).prune(timedelta(days=1)) == 0


def test_prune_refuses_a_negative_age_or_batch(turn_store: AgentTurnStore) -> None:
    with pytest.raises(ValueError):
        prunable_store(turn_store).prune(timedelta(days=-1))
    with pytest.raises(ValueError):
        prunable_store(turn_store).prune(timedelta(days=1), batch_size=0)


def test_the_tenant_is_stored_with_the_turn(turn_store: AgentTurnStore, other_turn_store: AgentTurnStore) -> None:
    turn_store.save(make_turn("r-1", tenant_id="tenant-a"), -1)
    turn_store.save(make_turn("r-2"), -1)
    assert other_turn_store.load("r-1").tenant_id == "tenant-a"
    assert other_turn_store.load("r-2").tenant_id is None
