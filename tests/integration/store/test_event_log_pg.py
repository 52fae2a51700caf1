"""The PostgreSQL event log under concurrent commits: a reader with a cursor never skips an event.

Ids from a sequence are handed out at insert time, not at commit: a transaction can take a
low id, stay open, and commit after transactions with higher ids. Positions are handed out
by a counter per turn tree and conversation whose row lock lasts until the save commits,
so a later save of the same scope waits for an open one, while other scopes go on. These
tests hold some writers' transactions open on purpose (a trigger on the events table waits
on an advisory lock or sleeps, after the row got its positions) while other writers save
and a reader polls.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import make_url

import store
from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentLoader,
    ScriptedChatModel,
    StoreError,
    ToolCall,
    VersionConflictError,
    tool,
)
from agent_runner.persistence import EventScope
from tests.helpers.other_database import transaction_open_elsewhere

pytestmark = pytest.mark.integration

E = AgentEventType

HOLD_TRIGGER = """
CREATE FUNCTION hold_event_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.payload->'data'->>'hold_lock' IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock((NEW.payload->'data'->>'hold_lock')::bigint);
    END IF;
    IF NEW.payload->'data'->>'hold_s' IS NOT NULL THEN
        PERFORM pg_sleep((NEW.payload->'data'->>'hold_s')::float8);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_event_insert AFTER INSERT ON agent_turn_events
    FOR EACH ROW EXECUTE FUNCTION hold_event_insert();
"""
"""Makes an event insert wait, inside its transaction, when its data asks for it."""

Reader = Callable[[EventScope, str | None], list[AgentEvent]]
"""Reads a page of events of a scope after a cursor."""


@pytest.fixture
def holding_url(pg_url: str) -> str:
    """A migrated schema whose event inserts can be held open (see HOLD_TRIGGER)."""
    libpq = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(libpq, autocommit=True) as connection:
        connection.execute(HOLD_TRIGGER)
    return pg_url


@pytest.fixture
def turns(holding_url: str) -> Iterator[store.SqlAgentTurnStore]:
    with store.SqlAgentTurnStore(holding_url) as sql_store:
        yield sql_store


def ids(events: list[AgentEvent]) -> list[str]:
    return [e.event_id for e in events]


def make_turn(turn_id: str, root: str | None = None) -> AgentTurn:
    return AgentTurn(
        id=turn_id,
        agent_id="agent",
        root_turn_id=root or turn_id,
        parent_turn_id=root,
        conversation_id="c-1" if root is None else None,
    )


def events_for(turn: AgentTurn, count: int, **data: Any) -> list[AgentEvent]:
    return [
        AgentEvent(
            event_id=f"{turn.id}:{turn.version + 1}:{n}",
            type=E.TOOL_COMPLETED if turn.version >= 0 else E.TURN_STARTED,
            turn_id=turn.id,
            conversation_id="c-1",
            data=data,
        )
        for n in range(count)
    ]


def store_reader(turns: store.SqlAgentTurnStore, limit: int = 5) -> Reader:
    return lambda scope, cursor: turns.read_events(scope, after=cursor, limit=limit)


class Follower:
    """Pages through a scope with a reader, keeping its cursor, as a subscriber would."""

    def __init__(self, read: Reader, scope: EventScope) -> None:
        self.read = read
        self.scope = scope
        self.cursor: str | None = None
        self.seen: list[str] = []

    def poll(self) -> int:
        found = 0
        while page := self.read(self.scope, self.cursor):
            self.seen += ids(page)
            self.cursor = page[-1].cursor
            found += len(page)
        return found

    def poll_until(self, count: int, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while len(self.seen) < count and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.01)


def wait_for_lock_waiter(admin: psycopg.Connection[Any], key: int, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        waiting = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid = %s",
            (key,),
        ).fetchone()
        if waiting is not None and waiting[0] > 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"no transaction started waiting on advisory lock {key}")


def holder_pid(admin: psycopg.Connection[Any], key: int) -> int:
    """The backend waiting on advisory lock `key` (inside its save, see HOLD_TRIGGER)."""
    row = admin.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid = %s", (key,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def wait_for_blocked_by(admin: psycopg.Connection[Any], pid: int, count: int, within: float = 30.0) -> None:
    """Wait until `count` backends wait, directly or behind another waiter, on a lock that backend `pid` holds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        waits = admin.execute(
            "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity WHERE cardinality(pg_blocking_pids(pid)) > 0"
        ).fetchall()
        blocked = {pid}
        grew = True
        while grew:
            before = len(blocked)
            blocked |= {waiter for waiter, blockers in waits if blocked & set(blockers)}
            grew = len(blocked) > before
        if len(blocked) - 1 >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{count} saves did not start waiting on backend {pid}")


def save_in_thread(
    url: str, turn: AgentTurn, events: list[AgentEvent], errors: list[BaseException]
) -> threading.Thread:
    """Start a thread that saves the next version of `turn` with `events` on a store of its own."""

    def save() -> None:
        with store.SqlAgentTurnStore(url) as own:
            try:
                own.save(turn, turn.version, events)
            except BaseException as exc:  # reported by the caller
                errors.append(exc)

    thread = threading.Thread(target=save)
    thread.start()
    return thread


def test_a_save_left_open_holds_back_the_later_saves_of_its_tree_and_readers_miss_nothing(
    turns: store.SqlAgentTurnStore, admin: psycopg.Connection[Any]
) -> None:
    url = turns.engine.url.render_as_string(hide_password=False)
    tree = Follower(store_reader(turns), EventScope.tree("r-1"))
    conversation = Follower(store_reader(turns), EventScope.conversation("c-1"))
    # Given a tree of three children, every event of which both readers have read
    root = turns.save(make_turn("r-1"), -1, events_for(make_turn("r-1"), 1))
    children = {name: make_turn(f"r-1.{name}", "r-1") for name in "abc"}
    for name, child in children.items():
        children[name] = turns.save(child, -1, events_for(child, 1))
    written = {"r-1:0:0", "r-1.a:0:0", "r-1.b:0:0", "r-1.c:0:0"}
    assert root.version == 0
    for follower in (tree, conversation):
        follower.poll_until(len(written))
    key = random.randint(1, 2**31 - 1)
    admin.execute("SELECT pg_advisory_lock(%s)", (key,))
    errors: list[BaseException] = []
    held = events_for(children["a"], 1, hold_lock=key)
    later = events_for(children["b"], 2) + events_for(children["c"], 1)
    threads = [save_in_thread(url, children["a"], held, errors)]
    try:
        # When a's save has taken its positions and stays open, and b and c save meanwhile
        wait_for_lock_waiter(admin, key)
        holder = holder_pid(admin, key)
        threads.append(save_in_thread(url, children["b"], later[:2], errors))
        threads.append(save_in_thread(url, children["c"], later[2:], errors))
        # Then b and c wait for a (the tree's counter row), and readers see nothing new meanwhile
        wait_for_blocked_by(admin, holder, 2)
        for _ in range(10):
            tree.poll()
            conversation.poll()
            time.sleep(0.01)
        assert set(tree.seen) == set(conversation.seen) == written
    finally:
        admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
        for thread in threads:
            thread.join(timeout=30)
    assert errors == []
    # And once a commits, everything comes, each event once: a's first, b's two in order
    written |= set(ids(held)) | set(ids(later))
    for follower in (tree, conversation):
        follower.poll_until(len(written))
        assert sorted(follower.seen) == sorted(written)
        assert follower.seen[4] == "r-1.a:1:0"
        rest = follower.seen[5:]
        assert sorted(rest) == ["r-1.b:1:0", "r-1.b:1:1", "r-1.c:1:0"]
        assert rest.index("r-1.b:1:1") == rest.index("r-1.b:1:0") + 1


def test_a_save_left_open_in_another_tree_delays_nothing_here(
    turns: store.SqlAgentTurnStore, admin: psycopg.Connection[Any]
) -> None:
    url = turns.engine.url.render_as_string(hide_password=False)

    def elsewhere(events: list[AgentEvent]) -> list[AgentEvent]:
        return [e.model_copy(update={"conversation_id": "c-2"}) for e in events]

    other = make_turn("other").model_copy(update={"conversation_id": "c-2"})
    other = turns.save(other, -1, elsewhere(events_for(other, 1)))
    key = random.randint(1, 2**31 - 1)
    admin.execute("SELECT pg_advisory_lock(%s)", (key,))
    errors: list[BaseException] = []
    holder = save_in_thread(url, other, elsewhere(events_for(other, 1, hold_lock=key)), errors)
    try:
        # Given a save of another tree and conversation that stays open
        wait_for_lock_waiter(admin, key)
        # When this tree saves, its events are readable at once, through the tree and the conversation
        root = turns.save(make_turn("r-1"), -1, events_for(make_turn("r-1"), 1))
        turns.save(root, 0, events_for(root, 2))
        expected = ["r-1:0:0", "r-1:1:0", "r-1:1:1"]
        assert ids(turns.read_events(EventScope.tree("r-1"))) == expected
        assert ids(turns.read_events(EventScope.conversation("c-1"))) == expected
    finally:
        admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
        holder.join(timeout=30)
    assert errors == []
    assert ids(turns.read_events(EventScope.tree("other"))) == ["other:0:0", "other:1:0"]


def test_parallel_children_with_slow_commits_reach_every_reader_exactly_once(holding_url: str) -> None:
    """Six children of one tree save concurrently, some transactions sleeping before they commit."""
    children, saves_each = 6, 8
    rng = random.Random(20261214)
    plans = {
        f"r-1.{index}": [(rng.randint(1, 2), rng.choice([None, None, 0.02, 0.15])) for _ in range(saves_each)]
        for index in range(children)
    }
    with store.SqlAgentTurnStore(holding_url) as turns:
        root = make_turn("r-1")
        turns.save(root, -1, events_for(root, 1))
        expected = {"r-1:0:0"}
        for turn_id, plan in plans.items():
            expected.add(f"{turn_id}:0:0")
            expected.update(
                f"{turn_id}:{version}:{n}" for version, (count, _) in enumerate(plan, 1) for n in range(count)
            )
        followers = [
            Follower(store_reader(turns, limit=3), EventScope.tree("r-1")),
            Follower(store_reader(turns, limit=7), EventScope.conversation("c-1")),
        ]
        errors: list[BaseException] = []
        start = threading.Event()

        def write(turn_id: str, plan: list[tuple[int, float | None]]) -> None:
            try:
                with store.SqlAgentTurnStore(holding_url) as own:
                    start.wait()
                    child = own.save(make_turn(turn_id, "r-1"), -1, events_for(make_turn(turn_id, "r-1"), 1))
                    for count, hold in plan:
                        data = {} if hold is None else {"hold_s": hold}
                        child = own.save(child, child.version, events_for(child, count, **data))
            except BaseException as exc:  # reported below
                errors.append(exc)

        writers = [threading.Thread(target=write, args=item) for item in plans.items()]
        for writer in writers:
            writer.start()
        start.set()
        while any(w.is_alive() for w in writers):
            for follower in followers:
                follower.poll()
        for writer in writers:
            writer.join(timeout=60)
        assert errors == []
        for follower in followers:
            follower.poll_until(len(expected))
            assert len(follower.seen) == len(set(follower.seen)) == len(expected)
            assert set(follower.seen) == expected
            # Each child's events in the order of its saves
            for turn_id in plans:
                own = [i for i in follower.seen if i.startswith(f"{turn_id}:")]
                assert own == sorted(own, key=lambda i: (int(i.split(":")[1]), int(i.split(":")[2])))


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"{order}: shipped"


def test_a_transaction_left_open_in_another_database_delays_no_event(
    pg_url: str, admin: psycopg.Connection[Any]
) -> None:
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name="lookup", arguments={"order": "A-1"})]), AiMessage("shipped")]
    )
    agent = Agent(id="orders", chat_model=model, tools=[lookup])
    with (
        store.SqlAgentTurnStore(pg_url) as turns,
        store.SqlChatMemoryProvider(pg_url) as memories,
        transaction_open_elsewhere(admin),
    ):
        # Given a write transaction left open in another database of the same server
        runner = AgentRunner(turn_store=turns, agent_loader=InMemoryAgentLoader([agent]), chat_memory_provider=memories)
        # When a turn runs to its end
        turn = runner.run(agent, "where is A-1?", conversation_id="c-open")
        assert turn.status is AgentTurnStatus.COMPLETED
        # Then all its events are readable at once, by tree and by conversation, the terminal one last
        by_tree = turns.read_events(EventScope.tree(turn.id))
        by_conversation = turns.read_events(EventScope.conversation("c-open"))
    types = [e.type for e in by_tree]
    assert types[0] is E.TURN_STARTED and types[-1] is E.TURN_COMPLETED
    assert {E.MODEL_RESPONSE, E.TOOL_STARTED, E.TOOL_COMPLETED} <= set(types)
    assert ids(by_conversation) == ids(by_tree)


# --- The one-statement save and the read query ------------------------------------------------


def test_the_fast_path_writes_events_in_its_single_statement_and_nothing_on_a_conflict(pg_url: str) -> None:
    with store.SqlAgentTurnStore(pg_url) as first, store.SqlAgentTurnStore(pg_url) as second:
        turn = first.save(make_turn("r-1"), -1, events_for(make_turn("r-1"), 1))
        stale = second.load("r-1")  # the second store now knows version 0
        statements: list[str] = []
        sa_event.listen(first.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        turn = first.save(turn, 0, events_for(turn, 3))
        assert len(statements) == 1 and "agent_turn_events" in statements[0]
        # A writer at a stale version, on the same fast path, writes none of its events
        with pytest.raises(VersionConflictError):
            second.save(stale, 0, [AgentEvent(event_id="stale", type=E.TURN_FAILED, turn_id="r-1")])
        # And the events of both saves are readable at once, at the positions 1 to 4 of the tree
        found = first.read_events(EventScope.tree("r-1"))
        assert ids(found) == ["r-1:0:0", "r-1:1:0", "r-1:1:1", "r-1:1:2"]
        assert [e.cursor for e in found] == ["1", "2", "3", "4"]
        assert [e.cursor for e in first.read_events(EventScope.conversation("c-1"))] == ["1", "2", "3", "4"]


def test_reading_events_uses_the_indexes(pg_url: str) -> None:
    captured: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            captured.append((statement, parameters))

    with store.SqlAgentTurnStore(pg_url) as turns:
        sa_event.listen(turns.engine, "before_cursor_execute", capture)
        turns.read_events(EventScope.tree("r-1"))
        turns.read_events(EventScope.conversation("c-1"), after="12")
        turns.read_events(EventScope.conversation("c-1"), after="12.34")  # a cursor of the earlier read order
        sa_event.remove(turns.engine, "before_cursor_execute", capture)
        with turns.engine.connect() as connection:
            connection.exec_driver_sql("SET enable_seqscan = off")
            plans = ["\n".join(r[0] for r in connection.exec_driver_sql("EXPLAIN " + s, p)) for s, p in captured]
    assert len(plans) == 4
    assert all("Seq Scan" not in plan and "ix_agent_turn_events" in plan for plan in plans), plans


def test_prune_in_batches_leaves_no_rows_of_pruned_trees(pg_url: str) -> None:
    old = datetime(2026, 1, 1, tzinfo=UTC)
    with store.SqlAgentTurnStore(pg_url) as turns, store.SqlTurnLease(pg_url) as lease:
        for index in range(12):
            root = make_turn(f"t-{index}").model_copy(
                update={"status": AgentTurnStatus.COMPLETED, "updated_at": old, "conversation_id": None}
            )
            turns.save(root, -1, events_for(root, 2))
            child = make_turn(f"t-{index}.a", f"t-{index}").model_copy(
                update={"status": AgentTurnStatus.COMPLETED, "updated_at": old}
            )
            turns.save(child, -1, events_for(child, 1))
            assert lease.acquire(child.id, "worker", 1000) is not None
        assert turns.prune(timedelta(days=1), batch_size=5) == 24
        with turns.engine.connect() as connection:
            counts = {
                table: connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()
                for table in ("agent_turns", "agent_turn_messages", "agent_turn_events", "agent_turn_leases")
            }
            counters = connection.execute(sa.text("SELECT conversation_id FROM agent_event_conversations")).all()
    assert counts == dict.fromkeys(counts, 0)
    # The conversation's position counter stays, as the conversation goes on (the trees' went with their roots)
    assert [tuple(row) for row in counters] == [("c-1",)]


def test_a_cursor_past_the_last_position_is_simply_later(turns: store.SqlAgentTurnStore) -> None:
    turns.save(make_turn("r-1"), -1, events_for(make_turn("r-1"), 1))
    assert turns.read_events(EventScope.tree("r-1"), after=str(2**62)) == []
    # An `<xid>.<id>` cursor of the earlier read order precedes every event written since
    assert ids(turns.read_events(EventScope.tree("r-1"), after=f"{2**62}.1")) == ["r-1:0:0"]


def test_a_save_takes_its_conversation_counters_in_one_order_whatever_the_order_of_its_events() -> None:
    from store._event_log import claim_positions

    # Events of one save filed under two conversations, in mixed order
    events = [
        AgentEvent(event_id=f"e{n}", type=E.TOOL_COMPLETED, turn_id="r-1.a", root_turn_id="r-1", conversation_id=c)
        for n, c in enumerate(["c-2", "c-1", None, "c-2"])
    ]
    claim = claim_positions(events)
    # Conversation counters are taken sorted by id (the lock order every save shares), each bumped by its count
    assert claim.conversations == [("c-1", 1), ("c-2", 2)]
    # And each event lands at the new last positions plus its offsets, in its order
    assert claim.offsets == [(-3, -1), (-2, 0), (-1, None), (0, 0)]


@pytest.mark.parametrize("database", ["pg_url", "sqlite_url"])
def test_a_child_whose_root_is_not_stored_cannot_save_events_and_nothing_is_written(
    database: str, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue(database))
    with store.SqlAgentTurnStore(url) as turns:
        # Given a child turn of a root turn that was never stored
        child = make_turn("r-9.a", "r-9")
        # When it is created, or saved, with events
        with pytest.raises(StoreError, match="root turn 'r-9', which is not stored"):
            turns.save(child, -1, events_for(child, 1))
        stored = turns.save(child, -1)
        with pytest.raises(StoreError, match="root turn 'r-9', which is not stored"):
            turns.save(stored, 0, events_for(stored, 2))
        # Then neither save wrote anything: the turn is as first stored without events
        assert turns.load("r-9.a").version == 0
        assert turns.read_events(EventScope.tree("r-9")) == []
