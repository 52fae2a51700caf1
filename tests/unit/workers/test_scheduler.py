"""The scheduler of the embedded processes: which tick a check fires, start-up grace, repeats, failures, stopping."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_runner import Agent, AgentRunner, AiMessage, InMemoryAgentLoader, ScriptedChatModel
from agent_runner.persistence import ConversationKey
from store import Inbox, SqlAgentTurnStore, SqlChatMemoryProvider
from workers.api import ApiSettings, create_app
from workers.cli import main
from workers.embedded_timers import MAX_SLEEP, RETRY_DELAY, STARTUP_GRACE, Scheduler, build_scheduler
from workers.schedules import Schedule, ScheduleError, ScheduleOutcome
from workers.settings import WorkerSettings

HOUR = datetime(2030, 1, 1, 12, tzinfo=UTC)
"""A tick of every schedule below that runs every five minutes."""
FIVE_MINUTES = Schedule("five-minutes", "ops-agent", "check", every=timedelta(minutes=5))


class Process:
    """What one embedded process holds: a runner on the shared SQLite file, its inbox, its own scheduler."""

    def __init__(self, url: str, *schedules: Schedule) -> None:
        self.turns = SqlAgentTurnStore(url)
        self.inbox = Inbox(url)
        agent = Agent(id="ops-agent", chat_model=ScriptedChatModel(lambda request: AiMessage(content="ok")))
        self.runner = AgentRunner(
            turn_store=self.turns,
            agent_loader=InMemoryAgentLoader([agent]),
            chat_memory_provider=SqlChatMemoryProvider(url),
        )
        self.notified: list[ConversationKey] = []
        self.scheduler = Scheduler(self.runner, self.inbox, schedules, notify_inbox=self.notified.append)

    def scheduled_ticks(self) -> list[str]:
        return sorted(t.metadata["scheduled_for"] for t in self.turns.list_turns(limit=1000))

    def close(self) -> None:
        self.scheduler.stop()
        self.turns.close()
        self.inbox.close()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'scheduler.db'}"


@pytest.fixture
def processes(url: str) -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.close()


def _process(processes: list[Process], url: str, *schedules: Schedule) -> Process:
    process = Process(url, *schedules)
    processes.append(process)
    return process


def test_on_start_the_newest_tick_fires_only_within_the_grace(processes: list[Process], url: str) -> None:
    # Given a process started 30 s after a tick, and another started 2 minutes after it
    recent = _process(processes, url, FIVE_MINUTES)
    late = _process(processes, url, Schedule("late", "ops-agent", "check", every=timedelta(minutes=5)))
    assert STARTUP_GRACE == timedelta(minutes=1)

    # When each checks for the first time
    fired_recent = recent.scheduler.check(HOUR + timedelta(seconds=30))
    fired_late = late.scheduler.check(HOUR + timedelta(minutes=2))

    # Then the recent tick fired (a restart that spans a tick keeps it); the old one waits for the next
    assert fired_recent == {"five-minutes": ScheduleOutcome.STARTED}
    assert fired_late == {}
    assert late.scheduler.check(HOUR + timedelta(minutes=4, seconds=59)) == {}
    assert late.scheduler.check(HOUR + timedelta(minutes=5)) == {"late": ScheduleOutcome.STARTED}
    turn = recent.turns.load(FIVE_MINUTES.turn_id(HOUR))
    assert turn.metadata["scheduled_for"] == HOUR.isoformat()


def test_each_tick_fires_once_and_missed_ticks_are_not_replayed(processes: list[Process], url: str) -> None:
    process = _process(processes, url, FIVE_MINUTES)
    scheduler = process.scheduler

    # A tick fires at its first check only
    assert scheduler.check(HOUR) == {"five-minutes": ScheduleOutcome.STARTED}
    assert scheduler.check(HOUR) == {}
    assert scheduler.check(HOUR + timedelta(minutes=4, seconds=59)) == {}
    # The next fires when its time comes, even when the check comes late
    assert scheduler.check(HOUR + timedelta(minutes=6)) == {"five-minutes": ScheduleOutcome.STARTED}
    # After a long pause (a suspended machine) only the newest tick fires, once
    assert scheduler.check(HOUR + timedelta(minutes=31)) == {"five-minutes": ScheduleOutcome.STARTED}
    assert scheduler.check(HOUR + timedelta(minutes=32)) == {}

    assert process.scheduled_ticks() == [(HOUR + timedelta(minutes=m)).isoformat() for m in (0, 5, 30)], (
        "the ticks between 5 and 30 were replayed"
    )


def test_two_processes_firing_the_same_tick_start_one_turn(processes: list[Process], url: str) -> None:
    first = _process(processes, url, FIVE_MINUTES)
    second = _process(processes, url, FIVE_MINUTES)

    assert first.scheduler.check(HOUR + timedelta(seconds=1)) == {"five-minutes": ScheduleOutcome.STARTED}
    assert second.scheduler.check(HOUR + timedelta(seconds=2)) == {"five-minutes": ScheduleOutcome.DUPLICATE}
    assert second.scheduler.check(HOUR + timedelta(minutes=5)) == {"five-minutes": ScheduleOutcome.STARTED}
    assert first.scheduler.check(HOUR + timedelta(minutes=5)) == {"five-minutes": ScheduleOutcome.DUPLICATE}

    assert first.scheduled_ticks() == [HOUR.isoformat(), (HOUR + timedelta(minutes=5)).isoformat()]


def test_a_queued_tick_asks_the_inbox_pump_to_start_it(processes: list[Process], url: str) -> None:
    schedule = Schedule("queued", "ops-agent", "check", every=60, conversation_id="conv-q", if_busy="enqueue")
    process = _process(processes, url, schedule)

    assert process.scheduler.check(HOUR) == {"queued": ScheduleOutcome.QUEUED}
    assert process.notified == [ConversationKey("conv-q")]
    message = process.inbox.get(schedule.turn_id(HOUR))
    assert message is not None and message.content == "check"


def test_a_tick_of_an_unknown_agent_waits_for_the_next_tick(processes: list[Process], url: str) -> None:
    # Given a schedule of an agent this process does not know (deployed later, say)
    unknown = Schedule("unknown", "missing-agent", "check", every=timedelta(minutes=5))
    process = _process(processes, url, unknown, FIVE_MINUTES)
    scheduler = process.scheduler

    # When its tick fails, the other schedule still fires, and the failed one waits for its next tick
    assert scheduler.check(HOUR) == {"five-minutes": ScheduleOutcome.STARTED}
    assert scheduler.next_check(HOUR) == HOUR + timedelta(minutes=1)  # MAX_SLEEP, not RETRY_DELAY
    assert [t.agent_id for t in process.turns.list_turns()] == ["ops-agent"]


def test_a_tick_the_database_did_not_take_is_tried_again_soon(tmp_path: Path) -> None:
    # Given a process whose database does not answer (nothing listens on port 1)
    unreachable = "postgresql+psycopg://agent-runner@127.0.0.1:1/nowhere?connect_timeout=2"
    turns = SqlAgentTurnStore(unreachable)
    inbox = Inbox(f"sqlite:///{tmp_path / 'inbox.db'}")
    runner = AgentRunner(turn_store=turns, agent_loader=InMemoryAgentLoader([]))
    scheduler = Scheduler(runner, inbox, [FIVE_MINUTES])
    try:
        # When its check fails, it checks again within RETRY_DELAY, for the same tick
        assert scheduler.check(HOUR) == {}
        assert scheduler.next_check(HOUR) == HOUR + RETRY_DELAY
        assert scheduler.check(HOUR + RETRY_DELAY) == {}
        assert scheduler.next_check(HOUR + RETRY_DELAY) == HOUR + 2 * RETRY_DELAY
    finally:
        turns.close()
        inbox.close()


def test_the_next_check_is_the_first_tick_of_any_schedule_within_a_minute(processes: list[Process], url: str) -> None:
    every_half_minute = Schedule("half-minute", "ops-agent", "check", every=30)
    daily = Schedule("daily", "ops-agent", "check", cron="0 9 * * *")
    scheduler = _process(processes, url, FIVE_MINUTES, every_half_minute, daily).scheduler
    now = HOUR + timedelta(seconds=10)

    assert scheduler.next_check(now) == HOUR + timedelta(seconds=30)
    assert _process(processes, url, daily).scheduler.next_check(now) == now + MAX_SLEEP


def test_the_thread_fires_ticks_as_they_come_and_stops_at_once(processes: list[Process], url: str) -> None:
    # Given a scheduler thread of a schedule every second, and one every hour
    hourly = Schedule("hourly", "ops-agent", "check", every=3600)
    process = _process(processes, url, Schedule("second", "ops-agent", "check", every=1), hourly)
    process.scheduler.start()
    assert process.scheduler.is_running

    # When it runs for a while
    def every_second() -> list[str]:
        turns = process.turns.list_turns(limit=100)
        return sorted(t.metadata["scheduled_for"] for t in turns if t.metadata["schedule"] == "second")

    deadline = time.monotonic() + 10
    while len(every_second()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)

    # Then each second's tick started its turn, and stopping wakes the sleeping thread at once
    ticks = [datetime.fromisoformat(t) for t in every_second()]
    assert len(ticks) >= 3
    assert ticks == [ticks[0] + timedelta(seconds=i) for i in range(len(ticks))]
    began = time.monotonic()
    assert process.scheduler.stop(timeout=5)
    assert time.monotonic() - began < 1
    assert not process.scheduler.is_running


def test_a_scheduler_without_schedules_starts_no_thread(processes: list[Process], url: str) -> None:
    scheduler = _process(processes, url).scheduler
    scheduler.start()
    assert not scheduler.is_running
    assert scheduler.stop()


# --- Start-up errors --------------------------------------------------------------------------


@pytest.fixture
def bad_schedules(tmp_path: Path) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"name": "x", "agent_id": "ops-agent", "input": "y", "cron": "0 25 * * *"}]))
    return path


def test_schedules_that_cannot_be_loaded_stop_the_scheduler_build(
    processes: list[Process], url: str, bad_schedules: Path
) -> None:
    process = _process(processes, url)
    with pytest.raises(ScheduleError, match="AGENT_RUNNER_SCHEDULES=.*cron '0 25 \\* \\* \\*' is invalid"):
        build_scheduler(process.runner, process.inbox, str(bad_schedules))
    assert build_scheduler(process.runner, process.inbox, None).schedules == ()


def test_the_embedded_server_refuses_schedules_it_cannot_load(bad_schedules: Path, url: str) -> None:
    settings = ApiSettings(workers=WorkerSettings(database_url=url, schedules=str(bad_schedules)))
    with pytest.raises(ScheduleError, match="cron '0 25 \\* \\* \\*' is invalid"):
        create_app(settings, worker="embedded")
    create_app(settings, worker="none")  # the processes that step turns fire them


def test_the_worker_command_refuses_schedules_it_cannot_load(bad_schedules: Path, url: str) -> None:
    result = CliRunner().invoke(
        main,
        ["--database-url", url, "worker", "--run-for", "0"],
        env={"CELERY_BROKER_URL": "", "AGENT_RUNNER_SCHEDULES": str(bad_schedules)},
        catch_exceptions=False,
    )
    assert result.exit_code == 2, result.output
    assert "AGENT_RUNNER_SCHEDULES" in result.output and "cron '0 25 * * *' is invalid" in result.output


def test_schedules_from_a_function_are_read_at_every_check_and_a_tenant_owns_their_turns(
    processes: list[Process], url: str
) -> None:
    # Given a scheduler over a function whose schedules change, without start-up grace
    process = _process(processes, url)
    current: list[Schedule] = []
    process.scheduler = Scheduler(
        process.runner, process.inbox, lambda: list(current), startup_grace=timedelta(0), poll=timedelta(seconds=1)
    )
    owned = Schedule("owned", "ops-agent", "check", every=timedelta(minutes=5), tenant_id="tenant-a")
    # When a schedule appears, the tick before it is not fired; the next one is
    assert process.scheduler.check(HOUR + timedelta(seconds=30)) == {}
    current.append(owned)
    assert process.scheduler.check(HOUR + timedelta(seconds=31)) == {}
    assert process.scheduler.check(HOUR + timedelta(minutes=5)) == {"owned": ScheduleOutcome.STARTED}
    (turn,) = process.turns.list_turns(limit=10)
    assert turn.tenant_id == "tenant-a"
    # And a schedule gone from the function fires no more
    current.clear()
    assert process.scheduler.check(HOUR + timedelta(minutes=10)) == {}
    assert process.scheduler.next_check(HOUR) == HOUR + timedelta(seconds=1)
    assert Schedule.from_dict(owned.to_dict()) == owned and "tenant_id" not in FIVE_MINUTES.to_dict()
