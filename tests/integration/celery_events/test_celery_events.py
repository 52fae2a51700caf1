"""Events of turns run by Celery worker processes, followed from other processes through `EventFeed`.

The turns run on real `celery worker` processes (PostgreSQL store, Redis live channel and
broker); followers are separate processes that follow the conversation with
`EventFeed(SqlAgentTurnStore, RedisLiveEvents).follow(...)`, as a web server would. What a
follower received is compared with the durable log, the live channel, and each turn's
final snapshot.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa

import store
from agent_runner import AgentEvent, AgentEventType, AgentTurn, AgentTurnStatus, EventFeed, EventScope, SuspensionType
from tests.integration.celery_events.event_agents import AGENT_ID, tool_starts
from tests.integration.celery_events.event_checks import (
    assert_turn_stories,
    durable,
    ephemeral,
    ids,
    read_all,
    tree_turns,
)
from tests.integration.celery_events.event_cluster import (
    Follower,
    event_cluster,
    start_follower,
    stop_followers,
)
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration

TURN_TIMEOUT_S = 60.0
FOLLOWER_TIMEOUT_S = 30.0
WAITING = (AgentTurnStatus.WAITING_FOR_USER, AgentTurnStatus.WAITING_FOR_APPROVAL)


def _spec(kind: str, label: str, **extra: object) -> str:
    return json.dumps({"kind": kind, "label": label, **extra})


def _live(cluster: Cluster) -> store.RedisLiveEvents:
    return store.RedisLiveEvents(cluster.redis_url, prefix=cluster.settings.redis_prefix)


def _answer_once_seen(cluster: Cluster, follower: Follower, turn_id: str) -> Callable[[], None]:
    """Play the person, who answers a form or an approval only once the follower has shown it.

    The turn cannot go on before the answer, so the follower must have received each
    suspension while the turn was running: it follows live, it does not replay at the end.
    """

    def tick() -> None:
        turn = cluster.load(turn_id)
        if turn.status not in WAITING:
            return
        shown = any(
            e.type is AgentEventType.TURN_SUSPENDED and e.turn_id == turn_id and e.data["version"] == turn.version
            for e in follower.events()
        )
        if shown:
            cluster.answer_people([turn_id])

    return tick


def _without_cursor(events: list[AgentEvent]) -> list[dict[str, object]]:
    return [e.model_dump(mode="json", exclude={"cursor"}) for e in events]


# --- A turn with a form, an approval, a retry and two parallel children -----------------------


@dataclass
class TourRun:
    """A finished conversation of two turns, and what a follower in another process received of it."""

    cluster: Cluster
    conversation_id: str
    root_ids: list[str]
    received: list[AgentEvent]
    turns: dict[str, AgentTurn]


@pytest.fixture(scope="module")
def tour(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TourRun]:
    """Two workers run a `tour` turn, then a plain one, in one conversation, with a follower from the start."""
    with event_cluster(postgres_url, tmp_path_factory.mktemp("tour")) as cluster:
        conversation_id = f"conv-{uuid.uuid4().hex[:8]}"
        follower = start_follower(cluster, "tour", conversation_id, roots=2)
        try:
            cluster.start_workers(2)
            first = cluster.runner.start(AGENT_ID, _spec("tour", "tour"), conversation_id=conversation_id)
            cluster.wait_for(
                lambda: cluster.load(first.id).is_terminal,
                TURN_TIMEOUT_S,
                "the tour turn to end",
                tick=_answer_once_seen(cluster, follower, first.id),
            )
            second = cluster.runner.start(AGENT_ID, _spec("plain", "after"), conversation_id=conversation_id)
            cluster.wait_for(lambda: cluster.load(second.id).is_terminal, TURN_TIMEOUT_S, "the second turn to end")
            received = follower.finish(FOLLOWER_TIMEOUT_S)
        finally:
            follower.kill()
        roots = [first.id, second.id]
        yield TourRun(cluster, conversation_id, roots, received, tree_turns(cluster.turn_store, roots))


def test_a_follower_in_another_process_gets_every_durable_event_once_in_commit_order_and_every_delta(
    tour: TourRun,
) -> None:
    # Given a conversation whose first turn asked for a form and an approval, retried a
    # failing tool and ran two children in parallel on two workers, then a second turn
    first = tour.turns[tour.root_ids[0]]
    assert {t.status for t in tour.turns.values()} == {AgentTurnStatus.COMPLETED}
    assert len(tour.turns) == 4 and len(first.children) == 2
    first_events = [e for e in tour.received if e.turn_id == first.id]
    suspended = {e.data["suspension_type"] for e in first_events if e.type is AgentEventType.TURN_SUSPENDED}
    assert suspended == {SuspensionType.USER_INPUT, SuspensionType.TOOL_APPROVAL, SuspensionType.CHILD_AGENT}
    assert AgentEventType.RETRY_SCHEDULED in {e.type for e in first_events}

    # When the follower's stream is compared with the durable log, read afterwards
    log = read_all(tour.cluster.turn_store.read_events, EventScope.conversation(tour.conversation_id))

    # Then it received every durable event exactly once, in the log's (commit) order
    assert ids(durable(tour.received)) == ids(log)
    assert _without_cursor(durable(tour.received)) == _without_cursor(log)

    # And every delta the workers published, once each and in order
    with _live(tour.cluster) as live:
        published = read_all(live.read, EventScope.conversation(tour.conversation_id))
    assert ids(ephemeral(tour.received)) == ids(ephemeral(published))
    assert {e.type for e in ephemeral(tour.received)} == {AgentEventType.MODEL_DELTA}

    # And per turn: saves in order up to the final version, each model call's deltas before
    # its response, nothing after the terminal event
    assert_turn_stories(tour.received, tour.turns)


def test_reconnecting_from_every_cursor_of_a_finished_tree_replays_exactly_the_suffix(tour: TourRun) -> None:
    # Given the finished turn trees of the conversation, read whole
    turn_store = tour.cluster.turn_store
    with _live(tour.cluster) as live:
        for scope in (EventScope.conversation(tour.conversation_id), EventScope.tree(tour.root_ids[0])):
            for feed in (EventFeed(turn_store, live), EventFeed(turn_store)):
                whole = read_all(feed.read, scope)
                assert ids(durable(whole)) == ids(read_all(turn_store.read_events, scope))
                if feed.live is not None:
                    assert ids(ephemeral(whole)) == ids(ephemeral(read_all(live.read, scope)))
                # (pages of any size add up to the same stream)
                assert ids(read_all(feed.read, scope, limit=4)) == ids(whole)

                # When a reader reconnects after each event's cursor in turn
                # Then it gets exactly the events that followed, each once
                for index, event in enumerate(whole):
                    replay = read_all(feed.read, scope, after=event.cursor)
                    assert ids(replay) == ids(whole[index + 1 :]), (scope, index, event.type)

            # And a follower that reconnects does too (and then waits for more, in vain)
            feed = EventFeed(turn_store, live)
            whole = read_all(feed.read, scope)
            for index in (0, len(whole) // 2, len(whole) - 1):
                followed = list(feed.follow(scope, after=whole[index].cursor, timeout=0.2, poll_interval=0.05))
                assert ids(followed) == ids(whole[index + 1 :]), (scope, index)

        # And the log's own cursors replay its suffixes, in pages of any size
        tree = EventScope.tree(tour.root_ids[0])
        log = read_all(turn_store.read_events, tree)
        for index, event in enumerate(log):
            replay = read_all(turn_store.read_events, tree, after=event.cursor, limit=3)
            assert ids(replay) == ids(log[index + 1 :])


# --- A worker killed mid-step ---------------------------------------------------------------------


def _assert_received_everything(
    cluster: Cluster,
    conversation_id: str,
    received: list[AgentEvent],
    turns: dict[str, AgentTurn],
    *,
    calls_ran_once: bool = True,
) -> None:
    """The conversation's durable log and its live deltas, each exactly once and in order, per turn as it should be."""
    log = read_all(cluster.turn_store.read_events, EventScope.conversation(conversation_id))
    assert ids(durable(received)) == ids(log)
    with _live(cluster) as live:
        published = read_all(live.read, EventScope.conversation(conversation_id))
    assert ids(ephemeral(received)) == ids(ephemeral(published))
    assert_turn_stories(received, turns, calls_ran_once=calls_ran_once)


def _tool_starts(cluster: Cluster) -> list[tuple[str, str, int]]:
    engine = sa.create_engine(cluster.settings.database_url)
    try:
        with engine.connect() as connection:
            query = sa.select(tool_starts.c.idempotency_key, tool_starts.c.effect, tool_starts.c.pid)
            return [(row[0], row[1], int(row[2])) for row in connection.execute(query.order_by(tool_starts.c.seq))]
    finally:
        engine.dispose()


def _shows(follower: Follower, turn_id: str, event_type: AgentEventType) -> bool:
    return any(e.turn_id == turn_id and e.type is event_type for e in follower.events())


def test_a_worker_killed_mid_step_duplicates_and_loses_no_event_and_a_follower_resumes_from_its_cursor(
    cluster: Cluster,
) -> None:
    # Given two workers and a beat (whose sweep hands a dead worker's turn to the other), two
    # followers of the conversation, and a turn whose first tool call takes 30 seconds the
    # first time it runs
    conversation_id = f"conv-{uuid.uuid4().hex[:8]}"
    steady = start_follower(cluster, "steady", conversation_id)
    dropped = start_follower(cluster, "dropped", conversation_id)
    followers = [steady, dropped]
    try:
        cluster.start_beat()
        cluster.start_workers(2)
        turn = cluster.runner.start(AGENT_ID, _spec("slow", "slow", seconds=30.0), conversation_id=conversation_id)
        cluster.wait_for(lambda: bool(_tool_starts(cluster)), TURN_TIMEOUT_S, "the slow tool to start")
        cluster.wait_for(
            lambda: _shows(dropped, turn.id, AgentEventType.MODEL_RESPONSE), TURN_TIMEOUT_S, "the first response"
        )

        # When the worker inside the tool is killed with SIGKILL, and so is one follower
        [(key, _, pid)] = _tool_starts(cluster)
        victim = cluster.worker_holding(pid)
        victim.kill()
        dropped.kill()
        before = dropped.events()
        assert before, "the dropped follower received nothing before it was killed"

        # And that follower reconnects after the last event it got, while the turn goes on
        resumed = start_follower(cluster, "resumed", conversation_id, after=before[-1].cursor)
        followers.append(resumed)
        cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, TURN_TIMEOUT_S, "the turn to end")
        whole = steady.finish(FOLLOWER_TIMEOUT_S)
        rest = resumed.finish(FOLLOWER_TIMEOUT_S)
    finally:
        stop_followers(followers)

    # Then the other worker re-ran the interrupted step, under the same idempotency key
    starts = _tool_starts(cluster)
    assert [k for k, _, _ in starts] == [key, key] and starts[1][2] != pid
    assert cluster.worker_holding(starts[1][2]) is not victim
    effects = [(row["effect"], row["executions"]) for row in cluster.ledger()]
    assert effects == [("slow.c0:w0", 1), ("slow.c1:w0", 1), ("slow:slow", 1)]

    # And the steady follower received every durable event exactly once, in the log's order,
    # and every delta once
    turns = tree_turns(cluster.turn_store, [turn.id])
    assert {t.status for t in turns.values()} == {AgentTurnStatus.COMPLETED}
    _assert_received_everything(cluster, conversation_id, whole, turns)

    # And the reconnected follower got exactly the rest: together, its two connections saw
    # what the steady one saw, durable events and deltas alike, with no gap and no repeat
    assert ids(durable(before + rest)) == ids(durable(whole))
    assert ids(ephemeral(before + rest)) == ids(ephemeral(whole))
    assert_turn_stories(before + rest, turns)
    print(f"killed worker {victim.name} (pid {victim.pid}) in the tool; {len(before)} events before, {len(rest)} after")


@dataclass
class Reconnecting:
    """A follower that is dropped (SIGKILL) now and then and reconnects after the last event it got."""

    cluster: Cluster
    name: str
    conversation_id: str
    roots: int
    connections: list[Follower] = field(default_factory=list)
    cursor: str | None = None

    def connect(self) -> None:
        name = f"{self.name}-{len(self.connections)}"
        self.connections.append(
            start_follower(self.cluster, name, self.conversation_id, after=self.cursor, roots=self.roots)
        )

    def drop_and_reconnect(self) -> None:
        current = self.connections[-1]
        if current.process.poll() is not None:
            return  # it saw the end already
        current.kill()
        got = current.events()
        if got:
            self.cursor = got[-1].cursor
        self.connect()

    def finish(self, timeout: float) -> list[AgentEvent]:
        self.connections[-1].finish(timeout)
        return [event for connection in self.connections for event in connection.events()]


@pytest.mark.slow
def test_conversations_through_repeated_worker_kills_reach_steady_and_reconnecting_followers_exactly_once(
    cluster: Cluster,
) -> None:
    # Given two workers and a beat, and three conversations that each run a `slow` turn (a
    # worker is killed inside its first tool call, and a new worker started) and then a `tour`
    # turn; each conversation has a steady follower and one dropped at every kill
    conversations = [f"conv-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    plans = {c: [_spec("slow", f"{c}-slow", seconds=30.0), _spec("tour", f"{c}-tour")] for c in conversations}
    steady = {c: start_follower(cluster, f"steady-{i}", c, roots=2) for i, c in enumerate(conversations)}
    dropping = {c: Reconnecting(cluster, f"dropping-{i}", c, roots=2) for i, c in enumerate(conversations)}
    for reconnecting in dropping.values():
        reconnecting.connect()
    roots: dict[str, list[str]] = {c: [] for c in conversations}
    killed: set[str] = set()

    def start_next_turns() -> None:
        for c in conversations:
            if len(roots[c]) < 2 and (not roots[c] or cluster.load(roots[c][-1]).is_terminal):
                roots[c].append(cluster.runner.start(AGENT_ID, plans[c][len(roots[c])], conversation_id=c).id)

    def kill_workers_in_slow_tools() -> None:
        for key, _, pid in _tool_starts(cluster):
            if key in killed:
                continue
            killed.add(key)
            try:
                victim = cluster.worker_holding(pid)
            except ProcessLookupError:
                continue  # killed already, with the worker of another slow call
            victim.kill()
            cluster.start_worker(f"w{len(cluster.processes)}", wait=False)
            for reconnecting in dropping.values():
                reconnecting.drop_and_reconnect()

    def tick() -> None:
        start_next_turns()
        kill_workers_in_slow_tools()
        for c in conversations:
            _answer_once_seen(cluster, steady[c], roots[c][-1])()

    def all_ended() -> bool:
        return all(len(roots[c]) == 2 and cluster.load(roots[c][-1]).is_terminal for c in conversations)

    try:
        cluster.start_beat()
        cluster.start_workers(2)
        # When they all run, with people answering as the steady followers show the questions
        cluster.wait_for(all_ended, 240, "every conversation's turns to end", tick=tick)
        whole = {c: steady[c].finish(FOLLOWER_TIMEOUT_S) for c in conversations}
        pieced = {c: dropping[c].finish(FOLLOWER_TIMEOUT_S) for c in conversations}
    finally:
        stop_followers([*steady.values(), *(f for r in dropping.values() for f in r.connections)])

    # Then every slow call was interrupted once and re-run once under its key
    starts = [key for key, _, _ in _tool_starts(cluster)]
    assert len(killed) == 3 and all(starts.count(key) == 2 for key in killed), starts

    # And in every conversation both followers received every durable event exactly once in
    # the log's order, and every delta once (a model call cut short by a kill streams twice)
    for c in conversations:
        turns = tree_turns(cluster.turn_store, roots[c])
        assert {t.status for t in turns.values()} == {AgentTurnStatus.COMPLETED}
        _assert_received_everything(cluster, c, whole[c], turns, calls_ran_once=False)
        assert ids(durable(pieced[c])) == ids(durable(whole[c]))
        assert ids(ephemeral(pieced[c])) == ids(ephemeral(whole[c]))
        assert_turn_stories(pieced[c], turns, calls_ran_once=False)
        print(f"{c}: {len(whole[c])} events; the dropped follower connected {len(dropping[c].connections)} times")
