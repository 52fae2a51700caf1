"""The embedded `AgentWorker` on the in-memory backends: polling, leases, fences, stop, children, failures."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentEvent,
    AgentExecutionPolicy,
    AgentFormDefinition,
    AgentFormRequiredException,
    AgentResumeCommand,
    AgentRunner,
    AgentStepResult,
    AgentToolContext,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    InMemoryTurnLease,
    Lease,
    Middleware,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    StoreUnavailableError,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)
from agent_runner.periodic import PeriodicSweep
from agent_runner.persistence import AgentTurnStore
from agent_runner.worker import _DISPATCHED_TURNS, AgentWorker
from tests.helpers.scenarios import looping_model
from tests.unit.agent_runner.turn_kit import (
    CountingPolls,
    FakeClock,
    RecordingStore,
    protocol_violations,
    tool_messages,
)

S = AgentTurnStatus
WAIT_S = 10.0


def wait_for(condition: Callable[[], bool], timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def steps_to_finish(calls: int) -> int:
    # one model step and one tool step per call, then the final model step
    return 2 * calls + 1


class StepIntervals(Middleware):
    """Records when each step of each turn started and ended, and the fence it carried."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.fences: list[tuple[str, int | None]] = []

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        start = time.monotonic()
        try:
            return call_next(turn)
        finally:
            with self._lock:
                self.intervals[turn.id].append((start, time.monotonic()))
                self.fences.append((turn.id, turn.lease_fence))

    def overlaps(self) -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
        found = []
        for turn_id, spans in self.intervals.items():
            ordered = sorted(spans)
            found += [(turn_id, a, b) for a, b in zip(ordered, ordered[1:], strict=False) if b[0] < a[1]]
        return found


class WatchedLease(InMemoryTurnLease):
    """An in-process lease that knows which fence currently holds each turn, and can refuse renewals."""

    def __init__(self) -> None:
        super().__init__()
        self.current: dict[str, int] = {}
        self.refuse_renewals = False
        self.renewals = 0
        self._watch = threading.Lock()

    def acquire(self, turn_id: str, owner: str, ttl_ms: int) -> Lease | None:
        lease = super().acquire(turn_id, owner, ttl_ms)
        if lease is not None:
            with self._watch:
                self.current[turn_id] = lease.fence
        return lease

    def renew(self, lease: Lease, ttl_ms: int) -> bool:
        self.renewals += 1
        return False if self.refuse_renewals else super().renew(lease, ttl_ms)

    def release(self, lease: Lease) -> bool:
        with self._watch:
            if self.current.get(lease.turn_id) == lease.fence:
                del self.current[lease.turn_id]
        return super().release(lease)


class LeaseChecker(Middleware):
    """Fails a step that runs without holding its turn's lease (fence missing or not the current one)."""

    def __init__(self, lease: WatchedLease) -> None:
        self.lease = lease
        self.violations: list[str] = []

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        held = self.lease.current.get(turn.id)
        if turn.lease_fence is None or held != turn.lease_fence:
            self.violations.append(f"{turn.id} stepped with fence {turn.lease_fence}, lease held by {held}")
        return call_next(turn)


@pytest.fixture
def workers() -> Iterator[list[AgentWorker]]:
    """Workers registered here are stopped after the test, whatever happened."""
    started: list[AgentWorker] = []
    yield started
    for worker in started:
        worker.stop(timeout=5)


def test_run_once_steps_ready_turns_to_their_blocking_point_and_returns_the_step_count() -> None:
    # Given two READY turns of an agent that calls a tool twice, and one that needs an approval
    ran: list[int] = []

    @tool
    def lookup(n: int) -> str:
        """Look something up."""
        ran.append(n)
        return f"result {n}"

    @tool(requires_approval=True)
    def deploy(n: int) -> str:
        """Deploy."""
        return "deployed"

    runner = AgentRunner()
    worker = AgentWorker(runner)
    agent = Agent(id="looker", chat_model=looping_model("lookup"), tools=[lookup])
    cautious = Agent(id="cautious", chat_model=looping_model("deploy", calls=1), tools=[deploy])
    first = runner.start(agent, "one")
    second = runner.start(agent, "two")
    waiting = runner.start(cautious, "deploy it")
    # When the worker makes one pass
    steps = worker.run_once()
    # Then each turn went as far as it could: two completed, one waits for approval
    assert steps == 2 * steps_to_finish(2) + 2
    assert runner.turn_store.load(first.id).status is S.COMPLETED
    assert runner.turn_store.load(second.id).status is S.COMPLETED
    assert runner.turn_store.load(waiting.id).status is S.WAITING_FOR_APPROVAL
    assert sorted(ran) == [0, 0, 1, 1]
    # And there is nothing left to do
    assert worker.run_once() == 0


def test_saves_carry_the_lease_fence_and_the_lease_is_released_at_the_end() -> None:
    store = RecordingStore()
    lease = InMemoryTurnLease()
    runner = AgentRunner(turn_store=store)
    worker = AgentWorker(runner, lease=lease)
    turn = runner.start(Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hello")
    assert worker.run_once() == 1
    saves = store.saves_of(turn.id)
    assert saves[0].lease_fence is None  # created before any worker touched it
    assert {s.lease_fence for s in saves[1:]} == {1}
    # released: another owner takes it at once, with the next fence
    taken = lease.acquire(turn.id, "someone-else", 10_000)
    assert taken is not None and taken.fence == 2


def test_submit_resume_lets_the_worker_continue_the_turn(workers: list[AgentWorker]) -> None:
    # Given a turn waiting for approval under a running worker
    executed: list[str] = []

    @tool(requires_approval=True)
    def deploy(n: int) -> str:
        """Deploy."""
        executed.append(AgentToolContext.current().get_idempotency_key())
        return "deployed"

    runner = AgentRunner()
    worker = AgentWorker(runner, poll_interval=0.05)
    workers.append(worker)
    worker.start()
    turn = runner.start(Agent(id="d", chat_model=looping_model("deploy", calls=1), tools=[deploy]), "go")
    wait_for(lambda: runner.turn_store.load(turn.id).status is S.WAITING_FOR_APPROVAL, what="the approval")
    # When the user approves with submit_resume (which runs nothing itself)
    resumed = runner.submit_resume(turn.id, AgentResumeCommand.approve_tool("call-0"))
    assert resumed.status is S.RUNNING
    # Then the worker executes the approved call once and the turn completes
    wait_for(lambda: runner.turn_store.load(turn.id).status is S.COMPLETED, what="completion")
    assert len(executed) == 1
    assert worker.stop(timeout=5) is True


def test_a_due_retry_is_picked_up_and_one_not_due_is_not() -> None:
    # Given a tool that fails recoverably once, with a 10 s backoff, on a fake clock
    clock = FakeClock()
    attempts: list[str] = []

    @tool
    def flaky(n: int) -> str:
        """Fails the first time."""
        attempts.append(AgentToolContext.current().get_idempotency_key())
        if len(attempts) == 1:
            raise RecoverableError("busy, try later")
        return "fine"

    policy = AgentExecutionPolicy(retry=RetryPolicy(initial_backoff=10, jitter=0))
    runner = AgentRunner(policy=policy, clock=clock)
    worker = AgentWorker(runner)
    turn = runner.start(Agent(id="f", chat_model=looping_model("flaky", calls=1), tools=[flaky]), "go")
    # When the worker steps it: model call, then the failing tool call schedules a retry
    assert worker.run_once() == 2
    scheduled = runner.turn_store.load(turn.id)
    assert scheduled.status is S.RETRY_SCHEDULED
    # Then a retry that is not due is left alone
    clock.advance(9)
    assert worker.run_once() == 0
    assert runner.turn_store.load(turn.id).version == scheduled.version
    # And once due, the worker retries the same call (same idempotency key) and finishes
    clock.advance(2)
    assert worker.run_once() == 2
    assert runner.turn_store.load(turn.id).status is S.COMPLETED
    assert len(attempts) == 2 and attempts[0] == attempts[1]


def completed(turns: AgentTurnStore, turn_id: str) -> Callable[[], bool]:
    """A condition for `wait_for`: the turn has completed."""
    return lambda: turns.load(turn_id).status is S.COMPLETED


def echoing_model(name: str) -> ScriptedChatModel:
    """A model that answers every request with its name and the last message's content."""
    return ScriptedChatModel(lambda request: AiMessage(content=f"{name}: {request.messages[-1].content}"))


def _delegating_runner(lease: WatchedLease, children: int) -> tuple[AgentRunner, Agent, LeaseChecker]:
    subs = [Agent(id=f"sub-{i}", chat_model=echoing_model(f"sub-{i}")) for i in range(children)]
    calls = [ToolCall(id=f"d{i}", name=f"sub-{i}", arguments={"task": f"part {i}"}) for i in range(children)]

    def lead_model(request: ChatRequest) -> AiMessage:
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            return AiMessage(tool_calls=calls)
        return AiMessage(content="; ".join(str(m.content) for m in request.messages if isinstance(m, ToolMessage)))

    lead = Agent(id="lead", chat_model=ScriptedChatModel(lead_model), sub_agents=subs)
    checker = LeaseChecker(lease)
    runner = AgentRunner(agent_loader=InMemoryAgentLoader([lead, *subs]), middleware=[checker])
    return runner, lead, checker


def test_children_fan_out_completes_with_worker_passes_and_every_step_holds_its_lease() -> None:
    # Given a lead agent that delegates to three sub-agents at once
    lease = WatchedLease()
    runner, lead, checker = _delegating_runner(lease, 3)
    worker = AgentWorker(runner, lease=lease)
    parent = runner.start(lead, "split the work")
    # When the worker makes passes until nothing is left
    total = 0
    for _ in range(10):
        steps = worker.run_once()
        total += steps
        if steps == 0:
            break
    # Then the children ran, the parent was resumed when the last one ended, and it completed
    done = runner.turn_store.load(parent.id)
    assert done.status is S.COMPLETED
    assert [m.content for m in tool_messages(done)] == ["sub-0: part 0", "sub-1: part 1", "sub-2: part 2"]
    assert all(link.status is S.COMPLETED for link in done.children)
    assert protocol_violations(done.messages) == []
    # And no step of parent or child ran outside the turn's lease
    assert checker.violations == []


def test_children_fan_out_completes_with_running_worker_threads(workers: list[AgentWorker]) -> None:
    lease = WatchedLease()
    runner, lead, checker = _delegating_runner(lease, 4)
    worker = AgentWorker(runner, lease=lease, concurrency=3, poll_interval=0.05)
    workers.append(worker)
    worker.start()
    parents = [runner.start(lead, f"job {n}") for n in range(3)]
    for parent in parents:
        wait_for(completed(runner.turn_store, parent.id), what="the parent to complete")
    assert checker.violations == []


def test_run_in_the_callers_thread_takes_the_lease_when_a_worker_is_attached() -> None:
    # Given a runner served by a worker (not started)
    store = RecordingStore()
    lease = WatchedLease()
    checker = LeaseChecker(lease)
    runner = AgentRunner(turn_store=store, middleware=[checker])
    AgentWorker(runner, lease=lease)
    # When the application runs a turn in its own thread
    turn = runner.run(Agent(id="a", chat_model=looping_model("echo", calls=0)), "hello")
    # Then every step held the lease, saves carry its fence, and it is released at the end
    assert turn.status is S.COMPLETED
    assert checker.violations == []
    assert turn.lease_fence == 1
    assert lease.current == {}


def test_run_waits_while_a_worker_thread_steps_the_turn_and_returns_the_blocked_turn(
    workers: list[AgentWorker],
) -> None:
    # Given a worker thread in the middle of a slow tool call of a turn
    in_tool = threading.Event()
    finish_tool = threading.Event()

    @tool
    def slow(n: int) -> str:
        """Slow work."""
        in_tool.set()
        assert finish_tool.wait(WAIT_S)
        return "slow done"

    runner = AgentRunner()
    worker = AgentWorker(runner, poll_interval=0.02)
    workers.append(worker)
    agent = Agent(id="s", chat_model=looping_model("slow", calls=1), tools=[slow])
    turn = runner.start(agent, "go")
    worker.start()
    assert in_tool.wait(WAIT_S)
    # When the application calls run_until_blocked on that same turn from its own thread
    outcome: list[AgentTurn] = []
    caller = threading.Thread(target=lambda: outcome.append(runner.run_until_blocked(runner.turn_store.load(turn.id))))
    caller.start()
    time.sleep(0.2)
    # Then it waits for the lease instead of calling the tool a second time
    assert caller.is_alive()
    finish_tool.set()
    caller.join(WAIT_S)
    assert not caller.is_alive()
    assert outcome[0].status is S.COMPLETED
    assert len(tool_messages(outcome[0])) == 1


def test_two_workers_in_threads_on_one_store_never_step_a_turn_at_once(workers: list[AgentWorker]) -> None:
    # Given two runners on one in-memory store, each served by a worker with two threads
    # (default leases: workers of one process on one store share the in-process lease)
    @tool
    def work(n: int) -> str:
        """Do some work."""
        time.sleep(0.002)
        return f"worked {n}"

    agent = Agent(id="w", chat_model=looping_model("work"), tools=[work])
    store = InMemoryAgentTurnStore()
    intervals = StepIntervals()
    runners = [
        AgentRunner(turn_store=store, agent_loader=InMemoryAgentLoader([agent]), middleware=[intervals])
        for _ in range(2)
    ]
    pool = [AgentWorker(r, concurrency=2, poll_interval=0.01, max_steps_per_claim=2) for r in runners]
    assert pool[0].lease is pool[1].lease
    workers.extend(pool)
    turns = [runners[n % 2].start(agent, f"job {n}") for n in range(30)]
    # When both work through them
    for worker in pool:
        worker.start()
    wait_for(
        lambda: all(store.load(t.id).status is S.COMPLETED for t in turns), timeout=20, what="all turns to complete"
    )
    # Then every turn completed with one step at a time, no step was repeated, and every step was fenced
    assert intervals.overlaps() == []
    for t in turns:
        done = store.load(t.id)
        assert len(intervals.intervals[t.id]) == steps_to_finish(2)
        assert [m.content for m in tool_messages(done)] == ["worked 0", "worked 1"]
    assert all(fence is not None for _, fence in intervals.fences)


def test_threads_sharing_one_worker_do_not_step_one_turn_together() -> None:
    # Lease backends hand a lease again to the owner that holds it; the worker's own threads
    # share one owner token, so the worker must keep them apart itself.
    in_tool = threading.Barrier(2, timeout=0.5)
    overlapping: list[bool] = []

    @tool
    def slow(n: int) -> str:
        """Slow work."""
        try:
            in_tool.wait()
            overlapping.append(True)  # two threads were inside the tool of one turn together
        except threading.BrokenBarrierError:
            pass
        return "ok"

    runner = AgentRunner()
    worker = AgentWorker(runner)
    turn = runner.start(Agent(id="s", chat_model=looping_model("slow", calls=1), tools=[slow]), "go")
    counts: list[int] = []
    threads = [threading.Thread(target=lambda: counts.append(worker.run_once())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert overlapping == []
    assert sorted(counts) == [0, steps_to_finish(1)]
    assert runner.turn_store.load(turn.id).status is S.COMPLETED


def test_stop_during_a_slow_tool_waits_for_it_and_keeps_the_lease_meanwhile(workers: list[AgentWorker]) -> None:
    # Given a worker thread inside a tool call that outlasts the lease TTL
    lease = InMemoryTurnLease()
    in_tool = threading.Event()
    finished: list[float] = []

    @tool
    def slow(n: int) -> str:
        """Slow work."""
        in_tool.set()
        time.sleep(0.6)
        finished.append(time.monotonic())
        return "slow done"

    store = RecordingStore()
    runner = AgentRunner(turn_store=store)
    worker = AgentWorker(runner, lease=lease, lease_ttl=0.2, poll_interval=0.02)
    workers.append(worker)
    turn = runner.start(Agent(id="s", chat_model=looping_model("slow", calls=1), tools=[slow]), "go")
    worker.start()
    assert in_tool.wait(WAIT_S)
    # When the worker is stopped (from another thread, so this one can probe the lease meanwhile)
    outcome: list[bool] = []
    stopper = threading.Thread(target=lambda: outcome.append(worker.stop(timeout=5)))
    stopper.start()
    time.sleep(0.35)
    intruder = lease.acquire(turn.id, "intruder", 10_000)
    stopper.join(WAIT_S)
    returned_at = time.monotonic()
    # Then the lease was still renewed while stop waited, so nobody could take the turn over
    assert intruder is None
    # And stop returned True only after the tool ended and its result was saved
    assert outcome == [True]
    assert finished and finished[0] <= returned_at
    assert not worker.is_running
    after = store.load(turn.id)
    assert [m.content for m in tool_messages(after)] == ["slow done"]
    # The turn stays RUNNING for the next worker: a stop starts no new step
    assert after.status is S.RUNNING
    time.sleep(0.1)
    assert store.load(turn.id).version == after.version
    # And a later pass (or a restarted worker) finishes it
    assert worker.run_once() == 1
    assert store.load(turn.id).status is S.COMPLETED


def test_stop_with_a_short_timeout_reports_the_busy_thread_which_then_finishes_its_step(
    workers: list[AgentWorker],
) -> None:
    in_tool = threading.Event()
    release = threading.Event()

    @tool
    def slow(n: int) -> str:
        """Slow work."""
        in_tool.set()
        assert release.wait(WAIT_S)
        return "slow done"

    runner = AgentRunner()
    worker = AgentWorker(runner, poll_interval=0.02)
    workers.append(worker)
    turn = runner.start(Agent(id="s", chat_model=looping_model("slow", calls=1), tools=[slow]), "go")
    worker.start()
    assert in_tool.wait(WAIT_S)
    started = time.monotonic()
    assert worker.stop(timeout=0.2) is False
    assert time.monotonic() - started < 1.0
    assert worker.is_running
    release.set()
    wait_for(lambda: not worker.is_running, what="the busy thread to end")
    assert [m.content for m in tool_messages(runner.turn_store.load(turn.id))] == ["slow done"]


def test_the_heartbeat_keeps_the_lease_through_a_tool_call_longer_than_the_ttl() -> None:
    # Given a lease TTL of 0.3 s and a tool that runs 1 s
    lease = WatchedLease()
    in_tool = threading.Event()
    intruders: list[Lease | None] = []

    @tool
    def slow(n: int) -> str:
        """Slow work."""
        in_tool.set()
        time.sleep(1.0)
        return "slow done"

    runner = AgentRunner()
    worker = AgentWorker(runner, lease=lease, lease_ttl=0.3)
    turn = runner.start(Agent(id="s", chat_model=looping_model("slow", calls=1), tools=[slow]), "go")

    def intrude() -> None:
        assert in_tool.wait(WAIT_S)
        for _ in range(8):
            time.sleep(0.1)
            intruders.append(lease.acquire(turn.id, "intruder", 10_000))

    intruder = threading.Thread(target=intrude)
    intruder.start()
    # When run_once (no background threads started) runs the slow tool
    steps = worker.run_once()
    intruder.join(WAIT_S)
    # Then the lease was renewed all along, so nobody else could take the turn, and it completed
    assert intruders and all(taken is None for taken in intruders)
    assert lease.renewals >= 3
    assert steps == steps_to_finish(1)
    assert runner.turn_store.load(turn.id).status is S.COMPLETED


def test_a_lost_lease_stops_the_worker_from_starting_another_step() -> None:
    lease = WatchedLease()
    lease.refuse_renewals = True

    @tool
    def slow(n: int) -> str:
        """Slow enough for a heartbeat to happen."""
        time.sleep(0.25)
        return "done"

    runner = AgentRunner()
    worker = AgentWorker(runner, lease=lease, lease_ttl=0.3)
    turn = runner.start(Agent(id="s", chat_model=looping_model("slow", calls=2), tools=[slow]), "go")
    # model step, then the first tool step during which the renewal is refused
    assert worker.run_once() == 2
    assert runner.turn_store.load(turn.id).status is S.RUNNING
    lease.refuse_renewals = False
    while worker.run_once():
        pass
    assert runner.turn_store.load(turn.id).status is S.COMPLETED


def test_a_turn_whose_lease_another_owner_holds_is_skipped() -> None:
    lease = InMemoryTurnLease()
    runner = AgentRunner()
    worker = AgentWorker(runner, lease=lease)
    turn = runner.start(Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hello")
    held = lease.acquire(turn.id, "another-worker", 10_000)
    assert held is not None
    assert worker.run_once() == 0
    assert runner.turn_store.load(turn.id).status is S.READY
    lease.release(held)
    assert worker.run_once() == 1
    assert runner.turn_store.load(turn.id).status is S.COMPLETED


def test_a_turn_whose_holder_died_is_recovered_once_its_lease_expires() -> None:
    lease = InMemoryTurnLease()
    runner = AgentRunner()
    worker = AgentWorker(runner, lease=lease)
    turn = runner.start(Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hello")
    # a holder that took the lease for 0.2 s and died
    assert lease.acquire(turn.id, "dead-worker", 200) is not None
    assert worker.run_once() == 0
    time.sleep(0.25)
    assert worker.run_once() == 1
    assert runner.turn_store.load(turn.id).status is S.COMPLETED


class FlakyLease(InMemoryTurnLease):
    """An in-process lease whose backend is down for the first `failures` acquisitions."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def acquire(self, turn_id: str, owner: str, ttl_ms: int) -> Lease | None:
        if self.failures > 0:
            self.failures -= 1
            raise StoreUnavailableError("lease backend down")
        return super().acquire(turn_id, owner, ttl_ms)


def test_a_lease_backend_outage_skips_the_turn_for_the_poll_and_the_next_poll_takes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner = AgentRunner()
    worker = AgentWorker(runner, lease=FlakyLease(failures=1))
    turn = runner.start(Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hello")
    with caplog.at_level(logging.DEBUG, logger="agent_runner"):
        assert worker.run_once() == 0
        assert worker.run_once() == 1
    assert runner.turn_store.load(turn.id).status is S.COMPLETED
    # The outage is expected and the next poll recovers: one warning line, no traceback
    noted = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [(record.levelno, record.exc_info) for record in noted] == [(logging.WARNING, None)]


class FlakySaves(InMemoryAgentTurnStore):
    """Fails the save after `after` successful ones, once, as a database that dropped the connection."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        self.after -= 1
        if self.after == -1:
            raise StoreUnavailableError("saving turn failed: AdminShutdown: terminating connection")
        return super().save(turn, expected_version, events)


def test_a_step_whose_save_meets_a_dropped_connection_logs_one_warning_and_the_next_pass_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a turn saved once (its start), whose next save meets a dropped connection
    runner = AgentRunner(turn_store=FlakySaves(after=1))
    worker = AgentWorker(runner, poll_interval=0.01)
    turn = runner.start(Agent(id="a", chat_model=ScriptedChatModel(lambda r: AiMessage(content="hi"))), "hello")
    with caplog.at_level(logging.DEBUG, logger="agent_runner"):
        # When the worker steps it, then passes again once the back-off after a failure is over
        worker.run_once()
        time.sleep(0.1)
        worker.run_once()
    # Then the turn completed, and the failed step is one warning line ending with the error, no traceback
    assert runner.turn_store.load(turn.id).status is S.COMPLETED
    noted = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [(record.levelno, record.exc_info) for record in noted] == [(logging.WARNING, None)]
    assert (
        noted[0]
        .getMessage()
        .endswith("(StoreUnavailableError: saving turn failed: AdminShutdown: terminating connection)")
    )


def test_a_foreground_run_reports_a_lease_backend_outage_instead_of_waiting() -> None:
    runner = AgentRunner()
    AgentWorker(runner, lease=FlakyLease(failures=1))
    with pytest.raises(StoreUnavailableError):
        runner.run(Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hello")


def test_an_exception_in_one_turn_does_not_stop_the_worker(
    workers: list[AgentWorker], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a turn whose agent this process does not know, and a healthy turn
    known = Agent(id="known", chat_model=ScriptedChatModel(lambda r: AiMessage(content="ok")))
    runner = AgentRunner(agent_loader=InMemoryAgentLoader([known]))
    store = runner.turn_store
    orphan = store.save(
        AgentTurn(id="orphan", agent_id="unknown", root_turn_id="orphan", messages=[UserMessage(content="x")]), -1
    )
    healthy = runner.start(known, "hello")
    worker = AgentWorker(runner, poll_interval=0.02)
    # When the worker passes over both
    with caplog.at_level(logging.ERROR, logger="agent_runner"):
        assert worker.run_once() == 1
    # Then the unexpected error is logged with its traceback
    assert [record.exc_info is not None for record in caplog.records if record.levelno >= logging.ERROR] == [True]
    # Then the healthy turn completed and the broken one is left runnable for a process that knows its agent
    assert store.load(healthy.id).status is S.COMPLETED
    assert store.load(orphan.id).status is S.READY
    # And the background threads keep serving new turns
    workers.append(worker)
    worker.start()
    later = runner.start(known, "again")
    wait_for(lambda: store.load(later.id).status is S.COMPLETED, what="the later turn")
    assert worker.is_running


def test_turns_backing_off_after_failures_do_not_hide_other_runnable_turns() -> None:
    known = Agent(id="known", chat_model=ScriptedChatModel(lambda r: AiMessage(content="ok")))
    runner = AgentRunner(agent_loader=InMemoryAgentLoader([known]))
    for n in range(3):
        runner.turn_store.save(AgentTurn(id=f"broken-{n}", agent_id="unknown", root_turn_id=f"broken-{n}"), -1)
    worker = AgentWorker(runner, batch_size=3)
    assert worker.run_once() == 0  # the three oldest turns are all broken
    healthy = runner.start(known, "hello")
    assert worker.run_once() == 1
    assert runner.turn_store.load(healthy.id).status is S.COMPLETED


def test_a_cancel_during_a_step_that_suspends_the_turn_ends_it() -> None:
    # Given a tool that asks for a form, while the turn is being cancelled
    form = AgentFormDefinition(key="details", description="Details", schema={"type": "object"})
    runner = AgentRunner()

    @tool
    def needs_form(n: int) -> str:
        """Needs a form."""
        runner.cancel(AgentToolContext.current().turn_id)
        raise AgentFormRequiredException(form)

    worker = AgentWorker(runner)
    turn = runner.start(Agent(id="f", chat_model=looping_model("needs_form", calls=1), tools=[needs_form]), "go")
    # When the worker runs it: the step in flight saves a suspension with the cancel flag set
    worker.run_once()
    # Then the worker ends the turn rather than leaving a cancelled turn waiting forever
    ended = runner.turn_store.load(turn.id)
    assert ended.status is S.CANCELLED
    assert protocol_violations(ended.messages) == []


def test_max_steps_per_claim_lets_other_turns_go_first() -> None:
    order: list[str] = []

    class Order(Middleware):
        def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
            order.append(turn.id)
            return call_next(turn)

    @tool
    def work(n: int) -> str:
        """Work."""
        return "ok"

    runner = AgentRunner(middleware=[Order()])
    worker = AgentWorker(runner, max_steps_per_claim=2)
    agent = Agent(id="w", chat_model=looping_model("work"), tools=[work])
    first, second = runner.start(agent, "one"), runner.start(agent, "two")
    assert worker.run_once() == 4
    assert order == [first.id, first.id, second.id, second.id]
    total = 4
    while steps := worker.run_once():
        total += steps
    assert total == 2 * steps_to_finish(2)


def test_a_dispatched_turn_runs_at_once_without_a_poll(workers: list[AgentWorker]) -> None:
    # Given a running worker whose poll comes only every minute, after its first poll
    store = CountingPolls()
    runner = AgentRunner(turn_store=store)
    worker = AgentWorker(runner, poll_interval=60)
    workers.append(worker)
    worker.start()
    wait_for(lambda: store.polls == 1, what="the first poll")
    # When turns are started (the runner dispatches them to the worker)
    started = [runner.start(Agent(id="a", chat_model=looping_model("work_tool", calls=0)), f"hi {n}") for n in range(3)]
    # Then the worker runs them right away, without polling the store for them
    for turn in started:
        wait_for(completed(store, turn.id), timeout=5, what="the dispatched turn")
    assert store.polls == 1


def test_a_dispatched_turn_that_used_its_share_of_steps_goes_on_without_a_poll(workers: list[AgentWorker]) -> None:
    @tool
    def work(n: int) -> str:
        """Work."""
        return "ok"

    store = CountingPolls()
    runner = AgentRunner(turn_store=store)
    worker = AgentWorker(runner, poll_interval=60, max_steps_per_claim=1)
    workers.append(worker)
    worker.start()
    wait_for(lambda: store.polls == 1, what="the first poll")
    # When a turn of 5 steps is dispatched to a worker that gives a turn one step per claim
    turn = runner.start(Agent(id="w", chat_model=looping_model("work"), tools=[work]), "go")
    # Then it is queued again after each step and completes long before the next poll
    wait_for(lambda: store.load(turn.id).status is S.COMPLETED, timeout=5, what="the turn")
    assert store.load(turn.id).steps == steps_to_finish(2)
    assert store.polls == 1


def test_dispatched_turn_ids_are_bounded_and_waiting_turns_are_left_to_the_poll() -> None:
    clock = FakeClock()
    runner = AgentRunner(clock=clock)
    worker = AgentWorker(runner)
    # A retry that is not due yet is not queued: the poll finds it once it is due
    worker.dispatch(
        AgentTurn(
            id="later",
            agent_id="a",
            status=S.RETRY_SCHEDULED,
            next_retry_at=clock.now + timedelta(minutes=1),
            messages=[UserMessage(content="x")],
        )
    )
    assert list(worker._dispatched) == []
    # Runnable turns are queued once each, and only the newest ones are kept
    turns = [
        AgentTurn(id=f"t-{n}", agent_id="a", messages=[UserMessage(content="x")])
        for n in range(_DISPATCHED_TURNS + 200)
    ]
    for turn in [*turns, *turns[-10:]]:
        worker.dispatch(turn)
    assert list(worker._dispatched) == [t.id for t in turns[-_DISPATCHED_TURNS:]]
    # Dispatched ids of turns that are not in the store cost nothing but a look
    assert worker.run_once() == 0
    assert list(worker._dispatched) == []


def test_a_worker_can_be_stopped_without_starting_restarted_and_used_after_a_stop() -> None:
    runner = AgentRunner()
    worker = AgentWorker(runner, poll_interval=0.02)
    assert worker.stop(timeout=1) is True
    worker.start()
    worker.start()  # already running: no second set of threads
    assert len([t for t in threading.enumerate() if t.name.startswith("agent-worker-0")]) >= 1
    assert worker.stop(timeout=5) is True
    assert not worker.is_running
    # run_once after a stop still works (a stop only ends the background threads)
    turn = runner.start(Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hello")
    assert worker.run_once() == 1
    with worker:
        second = runner.start(Agent(id="b", chat_model=ScriptedChatModel([AiMessage(content="hey")])), "hello")
        wait_for(lambda: runner.turn_store.load(second.id).status is S.COMPLETED, what="the second turn")
    assert runner.turn_store.load(turn.id).status is S.COMPLETED
    assert not worker.is_running


@pytest.mark.parametrize(
    "kwargs",
    [{"concurrency": 0}, {"lease_ttl": 0}, {"poll_interval": -1}, {"batch_size": 0}, {"max_steps_per_claim": 0}],
)
def test_invalid_settings_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        AgentWorker(AgentRunner(), **kwargs)


def test_a_worker_runs_the_sweeps_it_is_given_on_a_thread_beside_its_stepping_threads() -> None:
    # Given a worker given two sweeps instead of its default deadline sweep
    runs: dict[str, int] = defaultdict(int)

    def counting(name: str) -> Callable[[], int]:
        def run() -> int:
            runs[name] += 1
            return 0

        return run

    runner = AgentRunner()
    sweeps = [PeriodicSweep("fast", 0.02, counting("fast")), PeriodicSweep("slow", 60.0, counting("slow"))]
    worker = AgentWorker(runner, sweeps=sweeps, deadline_interval=1.0)
    assert worker.sweeps.intervals == {"fast": 0.02, "slow": 60.0} and worker.deadline_interval is None
    # When it runs a pass in this thread, every sweep runs once
    worker.run_once()
    assert dict(runs) == {"fast": 1, "slow": 1}
    # When it is started, each runs at once and then once per its interval, until it is stopped
    worker.start()
    deadline = time.monotonic() + 5.0
    while runs["fast"] < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.stop(timeout=5.0)
    assert runs["fast"] >= 5 and runs["slow"] == 2
    assert not worker.sweeps.is_running


def test_a_worker_given_no_sweeps_runs_the_deadline_sweep_every_deadline_interval() -> None:
    worker = AgentWorker(AgentRunner(), deadline_interval=3.0)
    assert worker.sweeps.intervals == {"deadlines": 3.0} and worker.deadline_interval == 3.0
    assert AgentWorker(AgentRunner(), deadline_interval=None).sweeps.intervals == {}
    with pytest.raises(ValueError, match="each sweep needs a name of its own"):
        AgentWorker(AgentRunner(), sweeps=[PeriodicSweep("a", 1.0, lambda: 0), PeriodicSweep("a", 2.0, lambda: 0)])
    with pytest.raises(ValueError, match="interval of sweep 'b' must be positive"):
        PeriodicSweep("b", 0.0, lambda: 0)
