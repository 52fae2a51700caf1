"""The tasks Celery beat sends: one per sweep of `workers.sweeps.SWEEPS`, and `run_schedule`.

The sweep tasks are made from the sweep table, as beat's schedule is
(`workers.celery_app.config.beat_schedule`), so every scheduled sweep has its task.
`run_schedule` fires one tick of a scheduled turn (`workers.schedules`); a tick starts its
turn once, however many beats sent it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import Celery

from agent_runner import StoreUnavailableError
from workers.celery_app.names import RUN_SCHEDULE
from workers.celery_app.process import current
from workers.celery_app.task_arguments import checked_arguments
from workers.schedules import Schedule, ScheduleError, ScheduleOutcome, fire_schedule
from workers.sweeps import SWEEPS, Sweep
from workers.wiring import ProcessBackends

logger = logging.getLogger("workers.beat")


def _sweep_entry(sweep: Sweep) -> Callable[[], int]:
    """The Celery entry point of `sweep`: a database or Redis that does not answer costs one warning line.

    Nothing is lost by skipping: the sweep reads the store afresh every tick, so the next
    tick does what this one could not.
    """

    @checked_arguments(sweep.task, 0)
    def entry() -> int:
        try:
            return sweep.run(current())
        except StoreUnavailableError as exc:
            logger.warning("%s skipped: %s; it runs again at the next tick", sweep.task, exc)
            return 0

    entry.__name__ = entry.__qualname__ = f"sweep_{sweep.name}"
    entry.__doc__ = f"Celery entry point of the `{sweep.name}` sweep."
    return entry


SWEEP_ENTRIES: dict[str, Callable[[], int]] = {sweep.name: _sweep_entry(sweep) for sweep in SWEEPS}
"""Sweep name -> the function its Celery task runs."""


def run_schedule(wiring: ProcessBackends, schedule: Schedule, tick: datetime) -> ScheduleOutcome:
    """Start (or queue) the turn of one tick of `schedule`; a repeated tick does nothing."""
    return fire_schedule(wiring.runner, wiring.inbox, schedule, tick, notify_inbox=wiring.dispatcher.send_inbox)


@checked_arguments(RUN_SCHEDULE, ScheduleOutcome.INVALID.value)
def _run_schedule(schedule: dict[str, Any], tick: Any) -> str:
    """Celery entry point of `run_schedule`: the message carries the schedule and the tick's ISO time.

    A message whose schedule or tick cannot be read is dropped with a warning, not retried.
    """
    try:
        parsed = Schedule.from_dict(schedule)
        moment = datetime.fromisoformat(tick) if isinstance(tick, str) else None
    except (ScheduleError, ValueError) as exc:
        logger.warning("rejected a %s message: %s; it is dropped, not retried", RUN_SCHEDULE, exc)
        return ScheduleOutcome.INVALID.value
    if moment is None:
        logger.warning("rejected a %s message: the tick is not an ISO 8601 time; it is dropped", RUN_SCHEDULE)
        return ScheduleOutcome.INVALID.value
    return run_schedule(current(), parsed, moment).value


def register_beat_tasks(app: Celery) -> None:
    """Register on `app` the task of every sweep of the table and `run_schedule` (on `app` only, not shared)."""
    for sweep in SWEEPS:
        app.task(name=sweep.task, shared=False, ignore_result=True)(SWEEP_ENTRIES[sweep.name])
    app.task(
        name=RUN_SCHEDULE,
        shared=False,
        ignore_result=True,
        # A database blip: the same tick may simply run again (it starts its turn once).
        autoretry_for=(StoreUnavailableError,),
        retry_backoff=True,
        retry_backoff_max=30,
        max_retries=5,
    )(_run_schedule)
