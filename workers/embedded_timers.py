"""The scheduler of the embedded processes, which fires without Celery beat what beat fires for a Celery deployment.

`Scheduler` fires the ticks of the scheduled turns (`workers.schedules`). The sweeps of the
sweep table are run by the embedded `AgentWorker` (`workers.sweeps.embedded_sweeps`).

Scheduled turns. `agent-runner serve` (worker mode `embedded`) and `agent-runner worker` run
a `Scheduler` over the schedules of `AGENT_RUNNER_SCHEDULES`; Celery deployments keep
`celery beat`. Both call `workers.schedules.fire_schedule` with the same tick times, so the
ticks, the turn ids and the outcomes are the same whichever drives them, and any number of
embedded processes (a server and several workers on one database) may run the same
schedules: the first to fire a tick starts its turn, the others find it stored and do nothing.

At each check the scheduler fires, for every schedule, the newest tick not after now,
unless this process fired it already; between checks it sleeps until the next tick of
any schedule (or until stopped). A tick that was due while the process was busy or
suspended fires late, once; the ticks before it are not replayed, as beat does not
replay them either.

On start a process has fired nothing yet. It fires the newest tick of a schedule only if
that tick is at most `STARTUP_GRACE` old: a restart that spans a tick (a deploy, a crash
and restart) still fires it, as a Celery worker back within the minute still runs the
tick beat sent meanwhile (beat's tick messages expire after at least `MIN_EXPIRY`), while
a process started long after a tick waits for the next one, as a newly started beat does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from agent_runner import AgentRunner, AgentRunnerError
from agent_runner.ids import utcnow
from agent_runner.persistence import ConversationKey
from store import Inbox
from workers.schedules import MIN_EXPIRY, Schedule, ScheduleOutcome, fire_schedule, load_schedules

logger = logging.getLogger("workers.scheduler")

STARTUP_GRACE = MIN_EXPIRY
"""How old the newest tick may be when a process starts for that process to fire it."""
RETRY_DELAY = timedelta(seconds=5)
"""How soon a tick whose firing failed (the database did not answer) is tried again."""
MAX_SLEEP = timedelta(seconds=60)
"""The longest sleep between checks, so that a change of the wall clock is noticed within it."""


class Scheduler:
    """Fires the ticks of `schedules` from a thread of this process (see the module docstring).

    Args:
        runner: Starts the turns of the ticks.
        inbox: Queues the ticks of `if_busy="enqueue"` schedules.
        schedules: The schedules to run, or a function returning them, asked at every check
            (schedules stored in the database, which change while the process runs: give a
            `poll` and call `wake()` after a change).
        notify_inbox: Called with the conversation of a queued tick (the process's inbox pump).
        clock: The current time (aware; UTC); tests pass their own.
        startup_grace: How old the newest tick may be at the first check to be fired.
    """

    def __init__(
        self,
        runner: AgentRunner,
        inbox: Inbox,
        schedules: Sequence[Schedule] | Callable[[], Sequence[Schedule]],
        *,
        notify_inbox: Callable[[ConversationKey], object] | None = None,
        clock: Callable[[], datetime] = utcnow,
        startup_grace: timedelta = STARTUP_GRACE,
        poll: timedelta = MAX_SLEEP,
    ) -> None:
        self.runner = runner
        self.inbox = inbox
        self._source = schedules if callable(schedules) else None
        self._static = () if callable(schedules) else tuple(schedules)
        self.notify_inbox = notify_inbox
        self.clock = clock
        self.startup_grace = startup_grace
        self._fired: dict[str, datetime] = {}
        self._failed = False
        self.poll = poll
        self._stopping = threading.Event()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The schedules as of now."""
        return tuple(self._source()) if self._source is not None else self._static

    def wake(self) -> None:
        """Check now rather than at the next tick (the schedules changed)."""
        self._wakeup.set()

    def check(self, now: datetime | None = None) -> dict[str, ScheduleOutcome]:
        """Fire the newest tick at or before `now` (default: the clock) of each schedule not fired yet here.

        Returns:
            Schedule name -> what its tick did, for the schedules that fired now. A tick
            whose firing failed is logged; when the failure may pass (the database did not
            answer) it is tried again at the next check, within `RETRY_DELAY`, else the
            schedule waits for its next tick (as beat's task retries only the former).
        """
        now = self.clock() if now is None else now
        fired: dict[str, ScheduleOutcome] = {}
        self._failed = False
        for schedule in self.schedules:
            tick = schedule.latest_tick(now)
            last = self._fired.get(schedule.name)
            if last is not None and tick <= last:
                continue
            if last is None and now - tick > self.startup_grace:
                self._fired[schedule.name] = tick  # older than the grace at start-up: wait for the next tick
                continue
            try:
                outcome = fire_schedule(self.runner, self.inbox, schedule, tick, notify_inbox=self.notify_inbox)
            except AgentRunnerError as exc:
                if exc.retryable:  # the database did not answer: try again soon, as beat's task retries
                    self._failed = True
                    logger.warning("schedule %s: tick %s failed, tried again: %s", schedule.name, tick, exc)
                    continue
                self._fired[schedule.name] = tick  # an unknown agent, say: the next tick tries again
                logger.error(
                    "schedule %s: tick %s started nothing: %s: %s", schedule.name, tick, type(exc).__name__, exc
                )
                continue
            except Exception:
                self._fired[schedule.name] = tick
                logger.exception("schedule %s: tick %s started nothing", schedule.name, tick.isoformat())
                continue
            self._fired[schedule.name] = tick
            fired[schedule.name] = outcome
            logger.info("schedule %s: tick %s %s", schedule.name, tick.isoformat(), outcome.value)
        return fired

    def next_check(self, now: datetime) -> datetime:
        """When to check next: the first tick after `now` of any schedule (sooner after a failure)."""
        soonest = min((schedule.next_run(now) for schedule in self.schedules), default=now + MAX_SLEEP)
        if self._failed:
            soonest = min(soonest, now + RETRY_DELAY)
        return min(soonest, now + self.poll)

    def start(self) -> None:
        """Start the thread (it does nothing without schedules, unless they come from a function)."""
        if self._source is None and not self._static:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="agent-runner-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the thread, waiting up to `timeout` seconds for a tick being fired; True when it stopped."""
        self._stopping.set()
        self._wakeup.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    @property
    def is_running(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            now = self.clock()
            try:
                self.check()
                now = self.clock()
                wait = (self.next_check(now) - now).total_seconds()
            except Exception:  # a schedule whose time cannot be computed, a source that failed; never the end
                logger.exception("the scheduler failed; it checks again shortly")
                self._failed = True
                wait = RETRY_DELAY.total_seconds()
            # A wake-up a hair before the tick finds nothing new and sleeps again, briefly.
            self._wakeup.wait(max(wait, 0.01))
            self._wakeup.clear()


def build_scheduler(
    runner: AgentRunner,
    inbox: Inbox,
    spec: str | None,
    *,
    notify_inbox: Callable[[ConversationKey], object] | None = None,
) -> Scheduler:
    """A scheduler of the schedules `AGENT_RUNNER_SCHEDULES` (`spec`) names; with none it never starts a thread.

    Raises:
        ScheduleError: The schedules cannot be loaded; the error names `AGENT_RUNNER_SCHEDULES`.
    """
    return Scheduler(runner, inbox, load_schedules(spec), notify_inbox=notify_inbox)
