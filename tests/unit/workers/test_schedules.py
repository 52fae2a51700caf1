"""Scheduled turns: definitions, files, tick times (intervals, cron, time zones) and the beat entries."""

from __future__ import annotations

import json
import shelve
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_runner import Agent, AgentRunner, AiMessage, InMemoryAgentLoader, InMemoryLiveEvents, ScriptedChatModel
from agent_runner.persistence import ConversationKey, EventScope
from store import Inbox, SqlAgentTurnStore, SqlChatMemoryProvider
from workers.celery_app.config import celery_config
from workers.live import attach_live
from workers.schedules import (
    IfBusy,
    Schedule,
    ScheduleError,
    ScheduleOutcome,
    ScheduleTimer,
    beat_entries,
    fire_schedule,
    load_schedules,
)
from workers.settings import SettingsError, WorkerSettings

PARIS = "Europe/Paris"
EXAMPLE_SCHEDULES = [
    Schedule("module-report", "report-agent", "Write the report", cron="0 6 * * mon", timezone=PARIS),
    Schedule("module-ping", "ops-agent", "ping", every=timedelta(minutes=5)),
]
"""Loaded by `load_schedules("tests.unit.workers.test_schedules:EXAMPLE_SCHEDULES")`."""


def _at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)


# --- Definitions ------------------------------------------------------------------------------


def test_an_interval_schedule_ticks_on_multiples_of_its_interval_since_the_epoch() -> None:
    schedule = Schedule("sync", "ops-agent", "sync now", every=2)

    assert schedule.interval == timedelta(seconds=2)
    assert schedule.latest_tick(_at(2030, 1, 1, 12, 0, 3)) == _at(2030, 1, 1, 12, 0, 2)
    assert schedule.latest_tick(_at(2030, 1, 1, 12, 0, 2)) == _at(2030, 1, 1, 12, 0, 2)
    assert schedule.next_run(_at(2030, 1, 1, 12, 0, 2)) == _at(2030, 1, 1, 12, 0, 4)
    hourly = Schedule("hourly", "ops-agent", "x", every=timedelta(hours=1))
    assert hourly.next_run(_at(2030, 1, 1, 12, 59, 59)) == _at(2030, 1, 1, 13)


def test_a_cron_schedule_is_read_in_its_time_zone() -> None:
    # 09:00 on weekdays in New York is 14:00 UTC in winter, 13:00 UTC in summer
    schedule = Schedule("standup", "ops-agent", "standup notes", cron="0 9 * * mon-fri", timezone="America/New_York")

    friday_evening = _at(2030, 1, 4, 20)
    assert schedule.next_run(friday_evening) == _at(2030, 1, 7, 14)  # Monday
    assert schedule.latest_tick(friday_evening) == _at(2030, 1, 4, 14)
    assert schedule.next_run(_at(2030, 7, 1, 12)) == _at(2030, 7, 1, 13)


def test_cron_skips_a_time_that_daylight_saving_skips_and_fires_a_repeated_time_once() -> None:
    nightly = Schedule("nightly", "ops-agent", "backup", cron="30 2 * * *", timezone=PARIS)
    # 2030-03-31: Paris jumps from 02:00 to 03:00, so 02:30 does not exist that day
    assert nightly.next_run(_at(2030, 3, 30, 12)) == _at(2030, 4, 1, 0, 30)
    # 2030-10-27: 02:00-03:00 happens twice; 02:30 fires the first time only
    first = nightly.next_run(_at(2030, 10, 26, 12))
    assert first == _at(2030, 10, 27, 0, 30)
    assert nightly.next_run(first) == _at(2030, 10, 28, 1, 30)
    assert nightly.latest_tick(first + timedelta(hours=1, minutes=5)) == first


def test_a_rare_cron_expression_is_found_years_ahead() -> None:
    leap = Schedule("leap", "ops-agent", "leap day", cron="0 0 29 2 *")
    assert leap.next_run(_at(2030, 3, 1)) == _at(2032, 2, 29)
    assert leap.latest_tick(_at(2030, 3, 1)) == _at(2028, 2, 29)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"every": 60, "cron": "* * * * *"}, "either every= or cron="),
        ({}, "either every= or cron="),
        ({"every": 0.5}, "at least one second"),
        ({"every": "soon"}, "timedelta or seconds"),
        ({"cron": "* * * *"}, "five fields"),
        ({"cron": "61 * * * *"}, "is invalid"),
        ({"cron": "0 0 30 2 *"}, "never occurs"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": 60, "timezone": PARIS}, "aligned to UTC"),
        ({"every": 60, "if_busy": "later"}, "if_busy must be one of"),
        ({"every": 60, "if_busy": "enqueue"}, "needs a conversation_id"),
        ({"every": 60, "if_busy": "skip"}, "needs a conversation_id"),
        ({"every": 60, "metadata": {"when": datetime(2030, 1, 1)}}, "JSON object"),
    ],
)
def test_a_definition_that_cannot_be_used_is_refused_naming_the_schedule(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ScheduleError, match=message) as raised:
        Schedule("bad-one", "ops-agent", "text", **fields)
    assert "bad-one" in str(raised.value)
    assert isinstance(raised.value, SettingsError)


@pytest.mark.parametrize(
    ("name", "agent_id", "text"), [("has space", "a", "x"), ("ok", "not an id!", "x"), ("ok", "a", "  ")]
)
def test_names_agents_and_input_are_checked(name: str, agent_id: str, text: str) -> None:
    with pytest.raises(ScheduleError):
        Schedule(name, agent_id, text, every=60)


def test_a_schedule_round_trips_through_its_json_form() -> None:
    for schedule in [
        Schedule("a", "ops-agent", "x", every=timedelta(minutes=5), conversation_id="c", if_busy="enqueue"),
        Schedule("b", "ops-agent", "y", cron="*/5 * * * *", timezone=PARIS, metadata={"team": "ops"}),
    ]:
        again = Schedule.from_dict(json.loads(json.dumps(schedule.to_dict())))
        assert again == schedule
        assert again.if_busy is IfBusy(schedule.if_busy)


def test_every_accepts_durations_written_with_a_unit() -> None:
    for text, seconds in [("90s", 90), ("5m", 300), ("2h", 7200), ("1d", 86400), ("30", 30), ("1.5m", 90)]:
        schedule = Schedule.from_dict({"name": "d", "agent_id": "a", "input": "x", "every": text})
        assert schedule.interval == timedelta(seconds=seconds)
    with pytest.raises(ScheduleError, match="not a duration"):
        Schedule.from_dict({"name": "d", "agent_id": "a", "input": "x", "every": "5 weeks"})
    with pytest.raises(ScheduleError, match="unknown keys"):
        Schedule.from_dict({"name": "d", "agent_id": "a", "input": "x", "every": 5, "at": "noon"})
    with pytest.raises(ScheduleError, match="missing input"):
        Schedule.from_dict({"name": "d", "agent_id": "a", "every": 5})


def test_each_tick_has_its_own_stable_turn_id() -> None:
    schedule = Schedule("ids", "ops-agent", "x", every=60)
    tick = _at(2030, 1, 1, 12)
    assert schedule.turn_id(tick) == schedule.turn_id(tick.astimezone(datetime.now().astimezone().tzinfo))
    assert schedule.turn_id(tick) != schedule.turn_id(tick + timedelta(minutes=1))
    assert schedule.turn_id(tick) != Schedule("other", "ops-agent", "x", every=60).turn_id(tick)


# --- Files and modules ------------------------------------------------------------------------


def test_schedules_load_from_yaml_json_and_a_module(tmp_path: Path) -> None:
    yaml_file = tmp_path / "schedules.yaml"
    yaml_file.write_text(
        "schedules:\n"
        "  - name: nightly-report\n"
        "    agent_id: report-agent\n"
        "    input: Write the nightly report\n"
        '    cron: "0 2 * * *"\n'
        "    timezone: Europe/Paris\n"
        "  - name: heartbeat\n"
        "    agent_id: ops-agent\n"
        "    input: check the queues\n"
        "    every: 5m\n"
        "    conversation_id: ops\n"
        "    if_busy: skip\n"
    )
    json_file = tmp_path / "schedules.json"
    json_file.write_text(json.dumps([{"name": "j", "agent_id": "a", "input": "x", "every": 10}]))

    from_yaml = load_schedules(str(yaml_file))
    assert [s.name for s in from_yaml] == ["nightly-report", "heartbeat"]
    assert from_yaml[0].timezone == PARIS and from_yaml[1].if_busy is IfBusy.SKIP
    assert [s.interval for s in load_schedules(str(json_file))] == [timedelta(seconds=10)]
    assert load_schedules(f"{__name__}:EXAMPLE_SCHEDULES") == EXAMPLE_SCHEDULES
    assert load_schedules(None) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[{", "not valid JSON"),
        ('{"name": "x"}', "list of schedules"),
        (
            '[{"name": "a", "agent_id": "x", "input": "y", "every": 9}, {"name": "a", "agent_id": "x", "input": "z", '
            '"every": 9}]',
            "several schedules are named",
        ),
        ('[{"name": "a", "agent_id": "x", "input": "y"}]', "either every= or cron="),
    ],
)
def test_a_bad_file_is_refused_naming_the_variable(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ScheduleError, match=message) as raised:
        load_schedules(str(path))
    assert "AGENT_RUNNER_SCHEDULES" in str(raised.value)


def test_a_missing_file_or_attribute_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScheduleError, match="cannot read"):
        load_schedules(str(tmp_path / "absent.yaml"))
    with pytest.raises(ScheduleError, match="has no attribute"):
        load_schedules(f"{__name__}:NO_SUCH_LIST")
    with pytest.raises(SettingsError, match="AGENT_RUNNER_SCHEDULES"):
        WorkerSettings.from_env({"AGENT_RUNNER_SCHEDULES": "schedules.txt"})


# --- Beat -------------------------------------------------------------------------------------


def test_the_celery_app_puts_one_beat_entry_per_schedule_next_to_the_sweeps() -> None:
    settings = WorkerSettings.from_env(
        {"AGENT_RUNNER_SCHEDULES": f"{__name__}:EXAMPLE_SCHEDULES", "AGENT_RUNNER_QUEUE": "q1"}
    )
    entries = celery_config(settings)["beat_schedule"]

    report = entries["agent-runner-schedule:module-report"]
    assert report["task"] == "agent_runner.run_schedule"
    assert report["options"]["queue"] == "q1"
    assert isinstance(report["schedule"], ScheduleTimer)
    assert report["args"][0] == EXAMPLE_SCHEDULES[0].to_dict()
    # The tick's time is computed when beat sends the message
    tick = datetime.fromisoformat(report["args"][1]())
    assert tick == EXAMPLE_SCHEDULES[0].latest_tick(datetime.now(UTC))
    assert entries["agent-runner-schedule:module-ping"]["options"]["expires"] == 300.0
    assert "agent-runner-sweep-deadlines" in entries


def test_the_timer_is_due_once_per_tick_whatever_the_last_run() -> None:
    schedule = Schedule("t", "ops-agent", "x", every=10)
    now = _at(2030, 1, 1, 12, 0, 23)
    timer = ScheduleTimer(schedule, nowfun=lambda: now)

    # Ran for the 12:00:20 tick: not due, check again at 12:00:30
    assert tuple(timer.is_due(_at(2030, 1, 1, 12, 0, 20, 5000))) == (False, 7.0)
    # Last ran before 12:00:20 (another beat's phase, or a restart an hour later): due now, once
    assert tuple(timer.is_due(_at(2030, 1, 1, 12, 0, 19))) == (True, 7.0)
    assert tuple(timer.is_due(_at(2030, 1, 1, 11))) == (True, 7.0)
    # A naive last-run time (Celery with enable_utc) counts as UTC
    assert tuple(timer.is_due(datetime(2030, 1, 1, 12, 0, 21))) == (False, 7.0)
    assert timer.remaining_estimate(_at(2030, 1, 1, 12, 0, 21)) == timedelta(seconds=7)


def test_beat_entries_survive_beats_schedule_file(tmp_path: Path) -> None:
    (name, entry), *_ = beat_entries([Schedule("p", "ops-agent", "x", every=30)], "q").items()
    # celery beat keeps its entries in a shelve file between runs
    with shelve.open(str(tmp_path / "beat-schedule")) as db:
        db["entry"] = entry
    with shelve.open(str(tmp_path / "beat-schedule")) as db:
        again = db["entry"]
    assert again["schedule"] == entry["schedule"]
    assert datetime.fromisoformat(again["args"][1]()).second in (0, 30)
    assert name == "agent-runner-schedule:p"


# --- Firing -----------------------------------------------------------------------------------


class Fleet:
    """A runner on SQLite, with the inbox, for firing ticks without Celery."""

    def __init__(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 'fire.db'}"
        self.turns = SqlAgentTurnStore(url)
        self.inbox = Inbox(url)
        agent = Agent(id="ops-agent", chat_model=ScriptedChatModel(lambda request: AiMessage(content="ok")))
        self.runner = AgentRunner(
            turn_store=self.turns,
            agent_loader=InMemoryAgentLoader([agent]),
            chat_memory_provider=SqlChatMemoryProvider(url),
        )
        self.notified: list[ConversationKey] = []
        self.live = InMemoryLiveEvents()
        attach_live(self.runner, self.live.publish)

    def fire(self, schedule: Schedule, tick: datetime) -> ScheduleOutcome:
        return fire_schedule(self.runner, self.inbox, schedule, tick, notify_inbox=self.notified.append)

    def close(self) -> None:
        self.turns.close()
        self.inbox.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Any:
    built = Fleet(tmp_path)
    yield built
    built.close()


def test_a_tick_starts_one_turn_and_a_repeat_of_it_none(fleet: Fleet) -> None:
    schedule = Schedule("report", "ops-agent", "write it", every=60, metadata={"team": "ops"})
    tick = _at(2030, 1, 1, 12)

    assert fleet.fire(schedule, tick) is ScheduleOutcome.STARTED
    assert fleet.fire(schedule, tick) is ScheduleOutcome.DUPLICATE
    assert fleet.fire(schedule, tick + timedelta(minutes=1)) is ScheduleOutcome.STARTED

    turns = fleet.turns.list_turns()
    assert len(turns) == 2
    first = fleet.turns.load(schedule.turn_id(tick))
    assert first.metadata == {"team": "ops", "schedule": "report", "scheduled_for": tick.isoformat()}
    assert first.messages[-1].content == "write it"


def test_a_busy_conversation_rejects_skips_or_queues_the_tick(fleet: Fleet) -> None:
    tick = _at(2030, 1, 1, 12)
    first = Schedule("chat", "ops-agent", "hello", every=60, conversation_id="c")
    assert fleet.fire(first, tick) is ScheduleOutcome.STARTED
    # The same tick again is a duplicate, not a busy conversation
    assert fleet.fire(first, tick) is ScheduleOutcome.DUPLICATE

    later = tick + timedelta(minutes=1)
    assert fleet.fire(first, later) is ScheduleOutcome.REJECTED
    skipping = Schedule("chat-skip", "ops-agent", "hello", every=60, conversation_id="c", if_busy="skip")
    assert fleet.fire(skipping, later) is ScheduleOutcome.SKIPPED
    queueing = Schedule("chat-queue", "ops-agent", "queued hello", every=60, conversation_id="c", if_busy="enqueue")
    assert fleet.fire(queueing, later) is ScheduleOutcome.QUEUED
    assert fleet.fire(queueing, later) is ScheduleOutcome.DUPLICATE
    assert fleet.notified == [ConversationKey("c")]

    queued = fleet.inbox.get(queueing.turn_id(later))
    assert queued is not None and queued.content == "queued hello" and queued.agent_id == "ops-agent"
    assert queued.metadata["scheduled_for"] == later.isoformat()
    assert len(fleet.turns.list_turns(conversation_id="c")) == 1
    # The conversation's followers are told at once, as for a message queued over HTTP
    announced = [
        e.data["message_id"] for e in fleet.live.read(EventScope.conversation("c")) if e.type == "MESSAGE_QUEUED"
    ]
    assert announced == [queueing.turn_id(later)]
