"""A turn started with `not_before`: READY, not stepped before its time by any path, stepped after it."""

from __future__ import annotations

import math
import threading
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from agent_runner import (
    Agent,
    AgentConversationBusyException,
    AgentEventType,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    InMemoryChatMemoryProvider,
    InputLimitError,
    InputLimits,
    ScriptedChatModel,
    StopReason,
)
from agent_runner.limits import check_not_before, check_start_delay
from agent_runner.persistence import EventScope
from agent_runner.worker import AgentWorker
from tests.unit.agent_runner.turn_kit import START, FakeClock

S = AgentTurnStatus


class CallTimes:
    """A chat model that answers "done" and records the wall-clock time of each call."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._lock = threading.Lock()
        self.model = ScriptedChatModel(self._answer)

    def _answer(self, request: ChatRequest) -> AiMessage:
        with self._lock:
            self.times.append(time.time())
        return AiMessage(content="done")


def test_a_delayed_turn_is_not_stepped_before_its_time_and_is_stepped_after_it() -> None:
    # Given a turn started 10 s ahead on a fake clock
    clock = FakeClock()
    calls = CallTimes()
    runner = AgentRunner(clock=clock)
    worker = AgentWorker(runner)
    turn = runner.start(Agent(id="a", chat_model=calls.model), "hi", not_before=clock.now + timedelta(seconds=10))
    # Then it is saved READY with its start time, and is not runnable
    assert turn.status is S.READY
    assert turn.starts_at == START + timedelta(seconds=10)
    assert not turn.is_runnable(clock.now)
    assert not runner.turn_store.get_ref(turn.id).is_runnable(clock.now)
    # When every stepping path tries it before its time
    clock.advance(9.9)
    assert worker.run_once() == 0
    assert runner.step(turn).turn == turn
    assert runner.run_until_blocked(turn) == turn
    result = runner.advance(turn)
    assert (result.steps, result.stopped) == (0, StopReason.BLOCKED)
    # Then nothing was called or saved
    assert calls.times == []
    assert runner.turn_store.load(turn.id).version == turn.version
    # And once its time has come, the worker runs it to the end, and the start time is gone
    clock.advance(0.1)
    assert worker.run_once() == 1
    done = runner.turn_store.load(turn.id)
    assert (done.status, done.final_output) == (S.COMPLETED, "done")
    assert done.next_retry_at is None and done.starts_at is None
    assert len(calls.times) == 1


def test_turn_started_tells_when_a_delayed_turn_may_run() -> None:
    clock = FakeClock()
    runner = AgentRunner(clock=clock)
    agent = Agent(id="a", chat_model=CallTimes().model)
    delayed = runner.start(agent, "later", not_before=clock.now + timedelta(minutes=5))
    at_once = runner.start(agent, "now")
    started = {
        event.turn_id: event.data
        for root in (delayed.id, at_once.id)
        for event in runner.turn_store.read_events(EventScope.tree(root))  # type: ignore[attr-defined]
        if event.type is AgentEventType.TURN_STARTED
    }
    # A follower learns when the delayed turn may run (ISO 8601, as every time on the wire)
    assert started[delayed.id]["starts_at"] == (START + timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    assert started[at_once.id]["starts_at"] is None


def test_a_start_time_that_has_passed_means_now() -> None:
    clock = FakeClock()
    runner = AgentRunner(clock=clock)
    turn = runner.start(Agent(id="a", chat_model=CallTimes().model), "hi", not_before=clock.now - timedelta(hours=1))
    assert (turn.status, turn.next_retry_at, turn.starts_at) == (S.READY, None, None)
    assert AgentWorker(runner).run_once() == 1
    assert runner.turn_store.load(turn.id).status is S.COMPLETED


def test_a_delayed_turn_is_stepped_by_running_worker_threads_at_its_time_and_not_before() -> None:
    # Given a polling worker on the real clock and a turn that may start 1 s from now
    calls = CallTimes()
    runner = AgentRunner()
    worker = AgentWorker(runner, poll_interval=0.05)
    worker.start()
    try:
        started = time.time()
        not_before = datetime.fromtimestamp(started, UTC) + timedelta(seconds=1)
        turn = runner.start(Agent(id="a", chat_model=calls.model), "hi", not_before=not_before)
        # When the worker polls through the delay
        deadline = time.monotonic() + 10
        while runner.turn_store.load(turn.id).status is not S.COMPLETED:
            assert time.monotonic() < deadline, "the delayed turn did not complete within 10 s"
            time.sleep(0.02)
    finally:
        assert worker.stop(timeout=5) is True
    # Then its one model call came at or after its start time, and well within the bound
    assert len(calls.times) == 1
    assert calls.times[0] >= not_before.timestamp()
    assert calls.times[0] - started < 10


def test_a_delayed_turn_can_be_cancelled_before_it_starts() -> None:
    clock = FakeClock()
    calls = CallTimes()
    runner = AgentRunner(clock=clock)
    turn = runner.start(Agent(id="a", chat_model=calls.model), "hi", not_before=clock.now + timedelta(seconds=5))
    # When it is cancelled while it waits
    cancelled = runner.cancel(turn.id, "changed my mind")
    # Then it ends at once, and is never stepped, even after its start time
    assert cancelled.status is S.CANCELLED and cancelled.starts_at is None
    clock.advance(10)
    assert AgentWorker(runner).run_once() == 0
    assert calls.times == []
    assert runner.turn_store.load(turn.id).status is S.CANCELLED


def test_a_delayed_turn_holds_its_conversation_while_it_waits() -> None:
    clock = FakeClock()
    runner = AgentRunner(clock=clock, chat_memory_provider=InMemoryChatMemoryProvider())
    agent = Agent(id="a", chat_model=CallTimes().model)
    waiting = runner.start(agent, "later", conversation_id="c-1", not_before=clock.now + timedelta(minutes=1))
    # Then a second turn of the conversation is refused while the delayed one waits
    with pytest.raises(AgentConversationBusyException) as busy:
        runner.start(agent, "now", conversation_id="c-1")
    assert busy.value.active_turn_id == waiting.id
    # And once it ran, the conversation is free again
    clock.advance(61)
    AgentWorker(runner).run_once()
    assert runner.turn_store.load(waiting.id).status is S.COMPLETED
    assert runner.start(agent, "now", conversation_id="c-1").status is S.READY


@pytest.mark.parametrize(
    ("not_before", "found"),
    [
        (datetime(2030, 1, 1, 12, 0), "naive datetime"),
        (START + timedelta(days=30, seconds=1), "seconds ahead"),
        ("2030-01-01T00:00:00Z", "a str"),
        (60, "an int"),
    ],
)
def test_a_bad_start_time_is_refused_and_nothing_is_saved(not_before: object, found: str) -> None:
    clock = FakeClock()
    runner = AgentRunner(clock=clock)
    with pytest.raises(InputLimitError) as refused:
        runner.start(Agent(id="a", chat_model=CallTimes().model), "hi", not_before=not_before)  # type: ignore[arg-type]
    assert refused.value.field == "not_before"
    assert found in refused.value.found
    assert runner.turn_store.list_turns() == []


def test_the_longest_start_delay_is_a_limit_of_the_policy() -> None:
    clock = FakeClock()
    runner = AgentRunner(clock=clock, policy=AgentExecutionPolicy(limits=InputLimits(max_start_delay_s=60)))
    agent = Agent(id="a", chat_model=CallTimes().model)
    assert runner.start(agent, "hi", not_before=clock.now + timedelta(seconds=60)).starts_at is not None
    with pytest.raises(InputLimitError, match="at most 60 seconds ahead"):
        runner.start(agent, "hi", not_before=clock.now + timedelta(seconds=61))


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, -math.inf, 30 * 24 * 3600 + 1, True, "5", None])
def test_a_bad_start_delay_is_refused(delay: object) -> None:
    with pytest.raises(InputLimitError) as refused:
        check_start_delay(delay, "after_seconds")
    assert refused.value.field == "after_seconds"
    assert "from 0 to 2592000" in refused.value.limit


def test_a_good_start_delay_and_start_time_are_accepted() -> None:
    assert check_start_delay(0, "d") == 0.0
    assert check_start_delay(1.5, "d") == 1.5
    assert check_start_delay(30 * 24 * 3600, "d") == 30 * 24 * 3600
    zoned = datetime(2030, 1, 1, 13, 0, tzinfo=UTC).astimezone(ZoneInfo("Europe/Paris"))
    now = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert check_not_before(zoned, now) == datetime(2030, 1, 1, 13, 0, tzinfo=UTC)
    assert check_not_before(zoned, now).tzinfo is UTC  # type: ignore[union-attr]
    assert check_not_before(now, now) is None
