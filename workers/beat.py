"""The periodic sweeps Celery beat schedules: they repair what a lost message or a dead worker left behind.

The fast paths (the dispatcher's messages, the follow-up a task sends, the inbox request a
terminal turn sends) move work along in milliseconds; these sweeps only compensate, so
they read the store, the one source of truth, and re-send messages:

- `sweep_inbox`: conversations with a PENDING inbox message and no active turn get a
  `dispatch_inbox`; a message left PROCESSING by a worker that died mid-dispatch is
  settled first (COMPLETED if its turn exists, else back to PENDING).
- `sweep_stale_turns`: RUNNING and READY turns that nobody touched for a lease TTL and
  whose lease is free (their worker died, or their message was lost) get a `step_turn`.
- `sweep_due_retries`: due RETRY_SCHEDULED turns whose ETA message was never sent (a wait
  beyond `AGENT_RUNNER_MAX_ETA_S`) or is overdue by a sweep interval (lost, purged) get a
  `step_turn`; parents stuck in WAITING_FOR_CHILD whose children ended are reconciled.
- `sweep_deadlines`: approvals and forms whose deadline passed get their `on_timeout`
  default through the normal resume path (decided by `"system"`, reason "deadline
  passed"); those past their reminder time get one DEADLINE_APPROACHING event.

Every sweep only sends idempotent messages or makes compare-and-swap decisions, so a sweep
that runs twice (two beats by mistake, a sweep overlapping the next) costs some no-op
deliveries and nothing else.

Beat also sends `run_schedule` for every tick of the scheduled turns (`workers.schedules`);
a tick starts its turn once, however many beats sent it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from agent_runner import AgentRunnerError, AgentTurnStatus, StoreUnavailableError, TurnRef
from workers.app import app
from workers.inbox import settle_stale_claims
from workers.names import RUN_SCHEDULE, SWEEP_DEADLINES, SWEEP_DUE_RETRIES, SWEEP_INBOX, SWEEP_STALE_TURNS
from workers.schedules import Schedule, ScheduleError, ScheduleOutcome, fire_schedule
from workers.task_arguments import checked_arguments
from workers.wiring import Wiring, current

logger = logging.getLogger("workers.beat")

SWEEP_BATCH = 500
"""Most items one sweep handles; the rest waits for the next sweep, oldest first."""


def sweep_inbox(wiring: Wiring) -> int:
    """Settle stuck inbox claims, then request a dispatch for every idle conversation with a PENDING message.

    Returns the number of conversations a `dispatch_inbox` was sent for.
    """
    _settle_stuck_claims(wiring)
    conversations = wiring.inbox.conversations_ready(SWEEP_BATCH)
    for conversation_id in conversations:
        wiring.dispatcher.send_inbox(conversation_id)
    return len(conversations)


def _settle_stuck_claims(wiring: Wiring) -> int:
    """Finish or undo inbox claims older than two lease TTLs (the claimer died between claim and mark).

    See `workers.inbox.settle_stale_claims`, which the HTTP server's inbox pump calls too.
    """
    cutoff = wiring.runner.clock() - timedelta(seconds=2 * wiring.settings.lease_ttl_s)
    return settle_stale_claims(wiring.runner, wiring.inbox, cutoff, SWEEP_BATCH)


def sweep_stale_turns(wiring: Wiring) -> int:
    """Re-enqueue RUNNING and READY turns idle for a lease TTL whose lease is free; return how many."""
    now = wiring.runner.clock()
    cutoff = now - timedelta(seconds=wiring.settings.lease_ttl_s)
    candidates = wiring.turn_store.list_idle([AgentTurnStatus.RUNNING, AgentTurnStatus.READY], cutoff, SWEEP_BATCH)
    return sum(_resend(wiring, ref) for ref in candidates)


def sweep_due_retries(wiring: Wiring) -> int:
    """Re-enqueue due retries the broker will not deliver, and reconcile stuck parents; return the turns sent."""
    settings = wiring.settings
    now = wiring.runner.clock()
    max_eta = timedelta(seconds=settings.max_eta_s)
    grace = timedelta(seconds=settings.sweep_interval_s)
    sent = 0
    for ref in wiring.turn_store.list_due_retries(now, SWEEP_BATCH):
        due = ref.next_retry_at or ref.updated_at
        # The dispatcher sent an ETA message exactly when the wait was within the limit; such
        # a retry is left to its message unless it is overdue (the message was lost or purged).
        had_eta_message = due - ref.updated_at <= max_eta
        if had_eta_message and due > now - grace:
            continue
        sent += _resend(wiring, ref)
    _reconcile_parents(wiring, now - timedelta(seconds=settings.lease_ttl_s))
    return sent


def _reconcile_parents(wiring: Wiring, updated_before: datetime) -> int:
    """Record ended children in parents that have waited since `updated_before`; resumed parents are dispatched."""
    # Parents saved recently most likely still have running children, the last of which
    # resumes them; only those waiting longer than a lease TTL are checked.
    waiting = wiring.turn_store.list_idle([AgentTurnStatus.WAITING_FOR_CHILD], updated_before, SWEEP_BATCH)
    reconciled = 0
    for parent in waiting:
        try:
            wiring.runner.reconcile_children(parent.turn_id)
            reconciled += 1
        except AgentRunnerError as exc:
            logger.warning("could not reconcile the children of turn %s: %s", parent.turn_id, exc)
    return reconciled


def sweep_deadlines(wiring: Wiring) -> int:
    """Send due deadline reminders and apply the defaults of passed deadlines; return the turns handled.

    The sweep is `AgentRunner.apply_due_deadlines`, the one the embedded `AgentWorker`
    runs too; a turn resumed by its default is enqueued by the runner's dispatcher like any resume.
    """
    return wiring.runner.apply_due_deadlines(SWEEP_BATCH)


def run_schedule(wiring: Wiring, schedule: Schedule, tick: datetime) -> ScheduleOutcome:
    """Start (or queue) the turn of one tick of `schedule`; a repeated tick does nothing."""
    return fire_schedule(wiring.runner, wiring.inbox, schedule, tick, notify_inbox=wiring.dispatcher.send_inbox)


def _resend(wiring: Wiring, ref: TurnRef) -> int:
    """Send a step for `ref` unless a live worker holds its lease; 1 if sent."""
    try:
        if wiring.lease.holder(ref.turn_id) is not None:
            return 0  # a live worker is on it (a long model call); its lease expires if it dies
    except AgentRunnerError as exc:
        logger.warning("could not read the lease of turn %s, sending anyway: %s", ref.turn_id, exc)
    return int(wiring.dispatcher.send_step(ref.turn_id, ref.version))


def _run_sweep(name: str, sweep: Callable[[Wiring], int]) -> int:
    """Run one sweep; a database or Redis that does not answer costs one warning line, not a traceback.

    Nothing is lost by skipping: the sweep reads the store afresh every tick, so the next
    tick does what this one could not.
    """
    try:
        return sweep(current())
    except StoreUnavailableError as exc:
        logger.warning("%s skipped: %s; it runs again at the next tick", name, exc)
        return 0


@checked_arguments(SWEEP_INBOX, 0)
def _sweep_inbox() -> int:
    """Celery entry point of `sweep_inbox`."""
    return _run_sweep(SWEEP_INBOX, sweep_inbox)


@checked_arguments(SWEEP_STALE_TURNS, 0)
def _sweep_stale_turns() -> int:
    """Celery entry point of `sweep_stale_turns`."""
    return _run_sweep(SWEEP_STALE_TURNS, sweep_stale_turns)


@checked_arguments(SWEEP_DUE_RETRIES, 0)
def _sweep_due_retries() -> int:
    """Celery entry point of `sweep_due_retries`."""
    return _run_sweep(SWEEP_DUE_RETRIES, sweep_due_retries)


@checked_arguments(SWEEP_DEADLINES, 0)
def _sweep_deadlines() -> int:
    """Celery entry point of `sweep_deadlines`."""
    return _run_sweep(SWEEP_DEADLINES, sweep_deadlines)


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


sweep_inbox_task = app.task(name=SWEEP_INBOX, ignore_result=True)(_sweep_inbox)
sweep_stale_turns_task = app.task(name=SWEEP_STALE_TURNS, ignore_result=True)(_sweep_stale_turns)
sweep_due_retries_task = app.task(name=SWEEP_DUE_RETRIES, ignore_result=True)(_sweep_due_retries)
sweep_deadlines_task = app.task(name=SWEEP_DEADLINES, ignore_result=True)(_sweep_deadlines)
run_schedule_task = app.task(
    name=RUN_SCHEDULE,
    ignore_result=True,
    # A database blip: the same tick may simply run again (it starts its turn once).
    autoretry_for=(StoreUnavailableError,),
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=5,
)(_run_schedule)
