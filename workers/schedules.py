"""Scheduled turns: start a turn for an agent at cron times or fixed intervals.

A `Schedule` names the agent, the input text and, optionally, the conversation of the
turns it starts; `every=` (a fixed interval) or `cron=` (five cron fields, read in
`timezone`) says when. Declare them in Python or in a YAML or JSON file, and point
`AGENT_RUNNER_SCHEDULES` at them. In a Celery deployment the app puts one beat entry per
schedule into its beat schedule, and `celery -A workers.app beat` sends a `run_schedule`
message at each tick; without Celery, `agent-runner worker` and `agent-runner serve`
(embedded mode) fire the ticks from a thread (`workers.embedded_timers`). Both end in
`fire_schedule`.

Each tick starts exactly one turn, even when two beat processes run by mistake. Beat
computes the tick's time when it sends the message (the newest tick not after its
clock), so every beat names the same tick, and the turn's id is derived from the
schedule's name and that time: a second start of the same tick finds the turn stored and
does nothing. A tick queued through a conversation's inbox uses the same id as its
inbox message id, which the inbox also accepts once. The embedded scheduler names its
ticks the same way, so any number of embedded processes fire each tick once too.

Ticks of `every=` schedules fall on whole multiples of the interval since 1970-01-01
00:00 UTC (`every=timedelta(hours=1)` fires on the hour), whatever time beat started.
Cron fields follow Celery's `crontab` (minute, hour, day of month, month, day of week
with 0 or `sun` for Sunday); a day must match both the day of month and the day of week.
A wall-clock time that a daylight-saving change skips does not fire that day, and one
that it repeats fires once, the first time.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.beat import BeatLazyFunc
from celery.schedules import BaseSchedule, crontab, schedstate

from agent_runner import (
    AgentConversationBusyException,
    AgentRunner,
    AgentRunnerError,
    TurnNotFound,
    UserMessage,
    VersionConflictError,
)
from agent_runner.agent import AGENT_ID_PATTERN
from agent_runner.ids import utcnow
from agent_runner.persistence import ConversationKey
from store import CronRecords, Inbox
from workers.live import announce
from workers.settings import SettingsError

logger = logging.getLogger("workers.schedules")

SCHEDULES_VARIABLE = "AGENT_RUNNER_SCHEDULES"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
ENTRY_PREFIX = "agent-runner-schedule:"
"""Prefix of the beat schedule entries of scheduled turns (the rest is the schedule's name)."""
MIN_EXPIRY = timedelta(minutes=1)
"""A tick message waits in the queue at most max(the schedule's period, this) before it is dropped."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TICK_NAMESPACE = uuid.UUID("0f8e3a52-3d1b-4c57-9a44-61b0f2e4c7d3")
_SEARCH_LIMIT = timedelta(days=366 * 8)
"""How far a cron search looks before deciding the expression never fires (Feb 29 fits)."""
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_FIELDS = frozenset(
    {"name", "agent_id", "input", "every", "cron", "timezone", "conversation_id", "if_busy", "metadata", "tenant_id"}
)


class ScheduleError(SettingsError):
    """A schedule definition that cannot be used; the message names the schedule and what is wrong."""

    def __init__(self, message: str, variable: str = SCHEDULES_VARIABLE, value: str | None = None) -> None:
        AgentRunnerError.__init__(self, message)
        self.variable = variable
        self.value = value


class IfBusy(StrEnum):
    """What a tick does when its conversation already has an active turn."""

    REJECT = "reject"
    """Start nothing for this tick; logged as a warning (the default)."""
    ENQUEUE = "enqueue"
    """Queue the input in the conversation's inbox; its turn starts when the conversation frees."""
    SKIP = "skip"
    """Start nothing for this tick, quietly (a tick that only matters while nothing else runs)."""


class ScheduleOutcome(StrEnum):
    """What one tick did (the `run_schedule` task's result, shown in the worker log)."""

    STARTED = "started"
    QUEUED = "queued"
    DUPLICATE = "duplicate"
    """The tick had already started its turn (or queued its message): a second beat, a redelivery."""
    REJECTED = "rejected"
    SKIPPED = "skipped"
    INVALID = "invalid"
    """The message's schedule or tick could not be read (a corrupt or forged message); dropped."""


@dataclass(frozen=True)
class Schedule:
    """Start a turn of `agent_id` with `input` at every tick.

    Args:
        name: Unique name of the schedule (letters, digits, `_ . : -`); it names the beat
            entry and, with the tick's time, the turn each tick starts.
        agent_id: The agent that runs the turns.
        input: The user message each turn starts from.
        every: A fixed interval (a `timedelta` or seconds, at least one second). Ticks fall
            on whole multiples of it since 1970-01-01 00:00 UTC.
        cron: Five cron fields, `"minute hour day-of-month month day-of-week"` (Celery's
            `crontab` syntax), read in `timezone`. Give `every` or `cron`, not both.
        timezone: IANA time zone of the cron fields, such as `"Europe/Paris"` (default UTC).
        conversation_id: Start the turns in this conversation (its history, one active turn
            at a time); None starts independent turns.
        if_busy: With a conversation that has an active turn at a tick: `"reject"` (start
            nothing, log a warning), `"enqueue"` (queue the input in the conversation's
            inbox) or `"skip"` (start nothing, quietly).
        metadata: JSON data kept with every turn, besides `schedule` and `scheduled_for`.
        tenant_id: The tenant that owns the turns and their conversation (schedules made
            through the HTTP API). `conversation_id` is the tenant's own id; the form
            `<tenant>/<id>` of earlier versions is still read as the tenant's `<id>`.

    Raises:
        ScheduleError: The definition cannot be used.
    """

    name: str
    agent_id: str
    input: str
    every: timedelta | float | None = None
    cron: str | None = None
    timezone: str = "UTC"
    conversation_id: str | None = None
    if_busy: IfBusy | str = IfBusy.REJECT
    metadata: Mapping[str, Any] = field(default_factory=dict)
    tenant_id: str | None = None

    def __post_init__(self) -> None:
        name = self.name if isinstance(self.name, str) else repr(self.name)
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise ScheduleError(f"schedule name {name!r} must match {NAME_PATTERN.pattern}")
        if not isinstance(self.agent_id, str) or not AGENT_ID_PATTERN.match(self.agent_id):
            raise ScheduleError(f"schedule {name!r}: agent_id {self.agent_id!r} is not an agent id")
        if not isinstance(self.input, str) or not self.input.strip():
            raise ScheduleError(f"schedule {name!r}: input must be non-empty text")
        if (self.every is None) == (self.cron is None):
            raise ScheduleError(f"schedule {name!r}: give either every= or cron=")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ScheduleError(f"schedule {name!r}: unknown time zone {self.timezone!r}") from None
        if self.every is not None:
            object.__setattr__(self, "every", _interval(self.every, name))
            if self.timezone != "UTC":
                raise ScheduleError(
                    f"schedule {name!r}: an every= interval is aligned to UTC; use cron= for times in {self.timezone}"
                )
        else:
            _parse_cron(self.cron, name)
            try:
                self.next_run(utcnow())
            except ScheduleError as exc:
                raise ScheduleError(f"schedule {name!r}: cron {self.cron!r}: {exc}") from None
        try:
            object.__setattr__(self, "if_busy", IfBusy(self.if_busy))
        except ValueError:
            known = ", ".join(repr(b.value) for b in IfBusy)
            raise ScheduleError(f"schedule {name!r}: if_busy must be one of {known}, got {self.if_busy!r}") from None
        if self.if_busy is not IfBusy.REJECT and self.conversation_id is None:
            raise ScheduleError(f"schedule {name!r}: if_busy={IfBusy(self.if_busy).value!r} needs a conversation_id")
        if self.conversation_id is not None and (not isinstance(self.conversation_id, str) or not self.conversation_id):
            raise ScheduleError(f"schedule {name!r}: conversation_id must be non-empty text")
        if self.tenant_id is not None and self.conversation_id is not None:
            # Definitions stored by earlier versions named a tenant's conversation `<tenant>/<id>`.
            owner, separator, own = self.conversation_id.partition("/")
            if separator and owner == self.tenant_id and own:
                object.__setattr__(self, "conversation_id", own)
        try:
            json.dumps(dict(self.metadata))
        except (TypeError, ValueError):
            raise ScheduleError(f"schedule {name!r}: metadata must be a JSON object") from None
        object.__setattr__(self, "metadata", dict(self.metadata))

    # --- when ---------------------------------------------------------------------------------

    @cached_property
    def _zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def interval(self) -> timedelta | None:
        """The `every=` interval as a `timedelta` (None for a cron schedule)."""
        return self.every if isinstance(self.every, timedelta) else None

    def next_run(self, after: datetime) -> datetime:
        """The first tick strictly after `after` (aware; UTC)."""
        after = _aware(after)
        interval = self.interval
        if interval is not None:
            return self.latest_tick(after) + interval
        return _cron_search(_parse_cron(self.cron, self.name), self._zone, after, forward=True)

    def latest_tick(self, at: datetime) -> datetime:
        """The newest tick at or before `at` (aware; UTC): the tick a beat sending at `at` fires."""
        at = _aware(at)
        interval = self.interval
        if interval is not None:
            step = interval // timedelta(microseconds=1)
            elapsed = (at - _EPOCH) // timedelta(microseconds=1)
            return _EPOCH + timedelta(microseconds=elapsed - elapsed % step)
        return _cron_search(_parse_cron(self.cron, self.name), self._zone, at, forward=False)

    def period(self, around: datetime | None = None) -> timedelta:
        """The interval, or for cron the gap between the two ticks after `around` (default: now)."""
        interval = self.interval
        if interval is not None:
            return interval
        first = self.next_run(around or utcnow())
        return self.next_run(first) - first

    def current_tick(self) -> str:
        """The newest tick not after the current time, as an ISO 8601 string (what beat sends)."""
        return self.latest_tick(utcnow()).isoformat()

    def describe(self) -> str:
        """`every 300s` or `cron 0 9 * * mon-fri (Europe/Paris)`, for listings."""
        interval = self.interval
        if interval is not None:
            return f"every {interval.total_seconds():g}s"
        return f"cron {self.cron} ({self.timezone})"

    # --- ids ----------------------------------------------------------------------------------

    def turn_id(self, tick: datetime) -> str:
        """The id of the turn `tick` starts (also the inbox message id of an enqueued tick)."""
        return uuid.uuid5(_TICK_NAMESPACE, f"{self.name}\n{_aware(tick).isoformat()}").hex

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, as in a schedules file (`every` in seconds)."""
        interval = self.interval
        data: dict[str, Any] = {
            "name": self.name,
            "agent_id": self.agent_id,
            "input": self.input,
            "timezone": self.timezone,
            "conversation_id": self.conversation_id,
            "if_busy": IfBusy(self.if_busy).value,
            "metadata": dict(self.metadata),
        }
        if interval is not None:
            data["every"] = interval.total_seconds()
        else:
            data["cron"] = self.cron
        if self.tenant_id is not None:
            data["tenant_id"] = self.tenant_id
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        """Build a schedule from its JSON form; `every` may be seconds or `"90s"`, `"5m"`, `"2h"`, `"1d"`.

        Raises:
            ScheduleError: Unknown keys, missing ones, or values that cannot be used.
        """
        if not isinstance(data, Mapping):
            raise ScheduleError(f"a schedule is a mapping of its fields, got {data!r}")
        label = data.get("name", "?")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise ScheduleError(f"schedule {label!r}: unknown keys {unknown}; known: {sorted(_FIELDS)}")
        missing = sorted({"name", "agent_id", "input"} - set(data))
        if missing:
            raise ScheduleError(f"schedule {label!r}: missing {', '.join(missing)}")
        values = dict(data)
        every = values.get("every")
        if isinstance(every, str):
            values["every"] = _duration(every, label)
        try:
            return cls(**values)
        except TypeError as exc:
            raise ScheduleError(f"schedule {label!r}: {exc}") from None


# --- Loading ----------------------------------------------------------------------------------


def load_schedules(spec: str | None) -> list[Schedule]:
    """The schedules named by `AGENT_RUNNER_SCHEDULES` (none when `spec` is None).

    `spec` is a `.yaml`, `.yml` or `.json` file holding a list of schedules (or a mapping
    with a `schedules` list), or `module:attribute` naming a list of `Schedule`s (or a
    function returning one).

    Raises:
        ScheduleError: The file or attribute cannot be read, a schedule is invalid, or two
            share a name. The error names `AGENT_RUNNER_SCHEDULES`.
    """
    if spec is None:
        return []
    try:
        if re.search(r"\.(ya?ml|json)$", spec, re.IGNORECASE):
            found = _read_file(Path(spec))
        else:
            found = _read_attribute(spec)
        schedules = [item if isinstance(item, Schedule) else Schedule.from_dict(item) for item in found]
    except ScheduleError as exc:
        raise ScheduleError(f"{SCHEDULES_VARIABLE}={spec!r}: {exc}", value=spec) from None
    names = [s.name for s in schedules]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ScheduleError(f"{SCHEDULES_VARIABLE}={spec!r}: several schedules are named {duplicates}", value=spec)
    return schedules


def _read_file(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScheduleError(f"cannot read {path}: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".json":
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"{path} is not valid JSON: {exc}") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ScheduleError(f"reading {path} needs PyYAML (pip install pyyaml), or use a .json file") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ScheduleError(f"{path} is not valid YAML: {exc}") from None
    if isinstance(data, Mapping) and set(data) == {"schedules"}:
        data = data["schedules"]
    if data is None:
        return []
    if not isinstance(data, list):
        raise ScheduleError(f"{path} must hold a list of schedules (or a mapping with a 'schedules' list)")
    return data


def _read_attribute(spec: str) -> list[Any]:
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except ImportError as exc:
        raise ScheduleError(f"cannot import module {module_name!r}: {exc}") from None
    except AttributeError:
        raise ScheduleError(f"{module_name!r} has no attribute {attribute!r}") from None
    if callable(target) and not isinstance(target, Schedule):
        target = target()
    if isinstance(target, Schedule):
        return [target]
    if not isinstance(target, Iterable) or isinstance(target, str | bytes | Mapping):
        raise ScheduleError(f"{spec} is not a list of Schedule objects")
    return list(target)


# --- Beat -------------------------------------------------------------------------------------


def beat_entries(schedules: Sequence[Schedule], queue: str) -> dict[str, dict[str, Any]]:
    """The `beat_schedule` entries of `schedules`, sending `run_schedule` messages to `queue`.

    Each entry fires at the schedule's ticks; the message carries the schedule (so the
    workers need not share the file) and the tick's time, computed when beat sends it.
    """
    from workers.celery_app.names import RUN_SCHEDULE

    entries: dict[str, dict[str, Any]] = {}
    for schedule in schedules:
        expires = max(schedule.period(), MIN_EXPIRY)
        entries[f"{ENTRY_PREFIX}{schedule.name}"] = {
            "task": RUN_SCHEDULE,
            "schedule": ScheduleTimer(schedule),
            "args": (schedule.to_dict(), BeatLazyFunc(schedule.current_tick)),
            "options": {"queue": queue, "expires": expires.total_seconds()},
        }
    return entries


class ScheduleTimer(BaseSchedule):  # type: ignore[misc]  # Celery is untyped
    """The Celery beat schedule of one `Schedule`: due at each of its ticks, never two per tick.

    Unlike Celery's interval schedule, which counts from the previous run (so two beats
    started apart fire at different times, and a late run shifts the next), ticks here are
    fixed points in time; a beat that restarts after a long pause fires once, for the
    newest tick.
    """

    def __init__(self, schedule: Schedule, nowfun: Callable[[], datetime] | None = None, app: Any = None) -> None:
        super().__init__(nowfun=nowfun, app=app)
        self.schedule = schedule

    def _now(self) -> datetime:
        return _aware(self.nowfun() if self.nowfun is not None else utcnow())

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time until the first tick after `last_run_at`."""
        return self.schedule.next_run(_aware(last_run_at)) - self._now()

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        """Due once a tick has passed since `last_run_at`; the second value is the seconds to check again."""
        now = self._now()
        due = self.schedule.next_run(_aware(last_run_at))
        if due <= now:
            return schedstate(True, max((self.schedule.next_run(now) - now).total_seconds(), 0.0))  # type: ignore[no-any-return]
        return schedstate(False, (due - now).total_seconds())  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.schedule, self.nowfun))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ScheduleTimer):
            return self.schedule == other.schedule and self.nowfun == other.nowfun
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.schedule.name, self.schedule.describe()))

    def __repr__(self) -> str:
        return f"<ScheduleTimer {self.schedule.name}: {self.schedule.describe()}>"


# --- Firing -----------------------------------------------------------------------------------


def fire_schedule(
    runner: AgentRunner,
    inbox: Inbox,
    schedule: Schedule,
    tick: datetime,
    *,
    notify_inbox: Callable[[ConversationKey], object] | None = None,
) -> ScheduleOutcome:
    """Start (or queue) the turn of one tick of `schedule`, at most once per tick.

    Args:
        runner: Starts the turn (a dispatching runner hands it to the workers).
        inbox: The inbox an `if_busy="enqueue"` tick queues its input in.
        schedule: The schedule.
        tick: The tick's time (from `Schedule.latest_tick`).
        notify_inbox: Called with the conversation after a message was queued, so that the
            conversation's next message starts if it is free (the Celery `dispatch_inbox`).

    Raises:
        AgentNotFound: The runner's loader does not know the schedule's agent.
        StoreUnavailableError: The store could not be reached; the tick may be fired again.
    """
    tick = _aware(tick)
    turn_id = schedule.turn_id(tick)
    metadata = {**schedule.metadata, "schedule": schedule.name, "scheduled_for": tick.isoformat()}
    conversation = schedule.conversation_id
    if conversation is not None and schedule.if_busy is IfBusy.ENQUEUE:
        if inbox.get(turn_id) is not None:
            return ScheduleOutcome.DUPLICATE
        queued = inbox.enqueue(
            conversation,
            turn_id,
            schedule.input,
            agent_id=schedule.agent_id,
            tenant_id=schedule.tenant_id,
            metadata=metadata,
        )
        announce(runner, queued.queued_event)
        if notify_inbox is not None:
            notify_inbox(queued.conversation)
        return ScheduleOutcome.QUEUED
    if _exists(runner, turn_id):
        return ScheduleOutcome.DUPLICATE
    try:
        runner.start(
            schedule.agent_id,
            UserMessage(id=f"{turn_id}-input", content=schedule.input),
            conversation_id=conversation,
            tenant_id=schedule.tenant_id,
            metadata=metadata,
            turn_id=turn_id,
        )
    except VersionConflictError:
        return ScheduleOutcome.DUPLICATE
    except AgentConversationBusyException as busy:
        if _exists(runner, turn_id):
            return ScheduleOutcome.DUPLICATE  # a second beat's start of this tick won the race
        if schedule.if_busy is IfBusy.SKIP:
            logger.info("schedule %s: tick %s skipped, conversation %s is busy", schedule.name, tick, conversation)
            return ScheduleOutcome.SKIPPED
        logger.warning(
            "schedule %s: tick %s started nothing, conversation %s is busy with turn %s (if_busy=reject)",
            schedule.name,
            tick.isoformat(),
            conversation,
            busy.active_turn_id,
        )
        return ScheduleOutcome.REJECTED
    return ScheduleOutcome.STARTED


def _exists(runner: AgentRunner, turn_id: str) -> bool:
    try:
        runner.turn_store.get_ref(turn_id)
    except TurnNotFound:
        return False
    return True


# --- Time helpers -----------------------------------------------------------------------------


def _aware(moment: datetime) -> datetime:
    """`moment` in UTC; a naive value is taken to be UTC (as Celery's clock gives it with enable_utc)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _interval(value: timedelta | float, name: str) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ScheduleError(f"schedule {name!r}: every must be a timedelta or seconds, got {value!r}")
    interval = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if interval < timedelta(seconds=1):
        raise ScheduleError(f"schedule {name!r}: every must be at least one second, got {value!r}")
    return interval


def _duration(text: str, name: str) -> float:
    match = _DURATION.match(text.strip())
    if match is None:
        raise ScheduleError(f"schedule {name!r}: every={text!r} is not a duration such as 30, '90s', '5m', '2h', '1d'")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


@dataclass(frozen=True)
class _CronFields:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 is Sunday, as in cron."""

    def date_matches(self, moment: datetime) -> bool:
        return (
            moment.month in self.months
            and moment.day in self.days
            and (moment.isoweekday() % 7) in self.weekdays  # isoweekday: Monday 1 .. Sunday 7
        )


def _parse_cron(expression: str | None, name: str) -> _CronFields:
    if not isinstance(expression, str):
        raise ScheduleError(f"schedule {name!r}: cron must be text such as '*/5 * * * *', got {expression!r}")
    parts = expression.split()
    if len(parts) != 5:
        raise ScheduleError(
            f"schedule {name!r}: cron {expression!r} needs five fields: minute hour day-of-month month day-of-week"
        )
    minute, hour, day_of_month, month_of_year, day_of_week = parts
    try:
        parsed = crontab(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year, day_of_week=day_of_week
        )
    except ValueError as exc:
        raise ScheduleError(f"schedule {name!r}: cron {expression!r} is invalid: {exc}") from None
    return _CronFields(
        minutes=frozenset(parsed.minute),
        hours=frozenset(parsed.hour),
        days=frozenset(parsed.day_of_month),
        months=frozenset(parsed.month_of_year),
        weekdays=frozenset(parsed.day_of_week),
    )


def _wall_time_instant(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """The instant of a local wall-clock time: its first occurrence, or None when a DST change skips it."""
    instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return instant


def _cron_search(fields: _CronFields, zone: ZoneInfo, origin: datetime, *, forward: bool) -> datetime:
    """The first tick after `origin` (forward) or the newest at or before it, as a UTC instant."""
    local = origin.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
    wall = local + timedelta(minutes=1) if forward else local
    minute = timedelta(minutes=1)
    for _ in range(_SEARCH_LIMIT // timedelta(days=1) * 3 + 24 * 60 * 2):
        if not fields.date_matches(wall):
            day = wall.replace(hour=0, minute=0)
            wall = day + timedelta(days=1) if forward else day - minute
        elif wall.hour not in fields.hours:
            hour = wall.replace(minute=0)
            wall = hour + timedelta(hours=1) if forward else hour - minute
        elif wall.minute not in fields.minutes:
            wall = wall + minute if forward else wall - minute
        else:
            instant = _wall_time_instant(wall, zone)
            if instant is not None and (instant > origin if forward else instant <= origin):
                return instant
            wall = wall + minute if forward else wall - minute
        if abs(wall - local) > _SEARCH_LIMIT:
            break
    raise ScheduleError(f"the cron expression never fires within {_SEARCH_LIMIT.days} days")


def stored_schedules(crons: CronRecords, now: datetime | None = None) -> list[Schedule]:
    """The schedules stored in the database (made over HTTP) that fire now: enabled and not ended.

    A definition that no longer loads is logged and left out.
    """
    now = now or utcnow()
    found = []
    for record in crons.list(every_tenant=True):
        if not record.enabled or (record.end_time is not None and record.end_time <= now):
            continue
        try:
            found.append(Schedule.from_dict(record.schedule))
        except ScheduleError as exc:
            logger.error("stored schedule %s cannot be fired: %s", record.cron_id, exc)
    return found
