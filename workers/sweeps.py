"""The periodic sweeps, in one table: what each runs, how often, and which setting changes it.

The fast paths (the dispatcher's messages, the follow-up a task sends, the inbox request a
terminal turn sends) move work along in milliseconds; these sweeps only compensate, so
they read the store, the one source of truth, and re-send messages:

- `inbox`: conversations with a PENDING inbox message and no active turn get a
  `dispatch_inbox`; a message left PROCESSING by a worker that died mid-dispatch is
  settled first (COMPLETED if its turn exists, else back to PENDING).
- `stale_turns`: RUNNING and READY turns that nobody touched for a lease TTL and whose
  lease is free (their worker died, or their message was lost) get a `step_turn`; under
  admission a READY turn that never started is left alone while the admission has it
  (waiting or admitted) and is lined up again otherwise, so a Redis that lost its lines
  loses no turn.
- `due_retries`: due RETRY_SCHEDULED turns, and READY turns whose delayed start has come,
  whose ETA message was never sent (a wait beyond `AGENT_RUNNER_MAX_ETA_S`) or is overdue
  by a sweep interval (lost, purged) get a `step_turn`; parents stuck in WAITING_FOR_CHILD whose children ended are reconciled.
- `deadlines`: approvals and forms whose deadline passed get their `on_timeout` default
  through the normal resume path (decided by `"system"`, reason "deadline passed"); those
  past their reminder time get one DEADLINE_APPROACHING event.
- `admission` (only with `AGENT_RUNNER_ADMISSION_WINDOW`): admission slots whose lease
  expired (an admitted turn that never started) are given back and the window is filled
  again (`workers.celery_app.admission`).
- `webhooks`: events owed to webhooks are found and the due attempts made (only when
  `AGENT_RUNNER_WEBHOOKS` is set).

Every sweep only sends idempotent messages or makes compare-and-swap decisions, so a sweep
that runs twice (two beats by mistake, a sweep overlapping the next) costs some no-op
deliveries and nothing else.

`SWEEPS` is the only list of them: Celery beat's schedule and the registered tasks
(`workers.celery_app`), the `sweep` label of the metrics (`workers.telemetry`) and the
sweeps the `AgentWorker` of an embedded process runs (`embedded_sweeps`) are made from it,
at the same intervals.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from agent_runner import AgentRunner, AgentRunnerError, AgentTurnStatus, TurnRef
from agent_runner.periodic import DEADLINE_SWEEP, PeriodicSweep
from workers.celery_app.names import (
    DELIVER_WEBHOOKS,
    SWEEP_ADMISSION,
    SWEEP_DEADLINES,
    SWEEP_DUE_RETRIES,
    SWEEP_INBOX,
    SWEEP_LABELS,
    SWEEP_STALE_TURNS,
)
from workers.inbox import settle_stale_claims
from workers.settings import WorkerSettings
from workers.webhook_deliverer import WebhookDeliverer, build_deliverer

if TYPE_CHECKING:
    from workers.wiring import ProcessBackends

logger = logging.getLogger("workers.beat")  # the name operators filter the sweeps by

SWEEP_BATCH = 500
"""Most items one sweep handles; the rest waits for the next sweep, oldest first."""


def sweep_inbox(wiring: ProcessBackends) -> int:
    """Settle stuck inbox claims, then request a dispatch for every idle conversation with a PENDING message.

    Returns the number of conversations a `dispatch_inbox` was sent for.
    """
    _settle_stuck_claims(wiring)
    conversations = wiring.inbox.conversations_ready(SWEEP_BATCH)
    for conversation in conversations:
        wiring.dispatcher.send_inbox(conversation)
    return len(conversations)


def _settle_stuck_claims(wiring: ProcessBackends) -> int:
    """Finish or undo inbox claims older than two lease TTLs (the claimer died between claim and mark).

    See `workers.inbox.settle_stale_claims`, which the HTTP server's inbox pump calls too.
    """
    cutoff = wiring.runner.clock() - timedelta(seconds=2 * wiring.settings.lease_ttl_s)
    return settle_stale_claims(wiring.runner, wiring.inbox, cutoff, SWEEP_BATCH)


def sweep_stale_turns(wiring: ProcessBackends) -> int:
    """Re-enqueue RUNNING and READY turns idle for a lease TTL whose lease is free; return how many."""
    now = wiring.runner.clock()
    cutoff = now - timedelta(seconds=wiring.settings.lease_ttl_s)
    candidates = wiring.turn_store.list_idle([AgentTurnStatus.RUNNING, AgentTurnStatus.READY], cutoff, SWEEP_BATCH)
    # A READY turn waiting for its delayed start is not stale; the due-retry sweep takes it once due.
    stale = [ref for ref in candidates if ref.is_runnable(now)]
    if wiring.admission is not None:
        # New turns that wait for admission (or sit admitted in the broker) are not stale: only
        # those the admission does not know are lined up again, each after a load of its tenant.
        lined_up = wiring.admission.lined_up([ref.turn_id for ref in stale if _is_new(ref)])
        stale = [ref for ref in stale if ref.turn_id not in lined_up]
    return sum(_resend(wiring, ref) for ref in stale)


def _is_new(ref: TurnRef) -> bool:
    """Whether `ref` is a turn that never started (READY at its first version): admission starts it."""
    return ref.version == 0 and ref.status is AgentTurnStatus.READY


def sweep_due_retries(wiring: ProcessBackends) -> int:
    """Re-enqueue due retries and delayed starts the broker will not deliver, and reconcile stuck parents; return the turns sent."""
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


def _reconcile_parents(wiring: ProcessBackends, updated_before: datetime) -> int:
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


def sweep_deadlines(wiring: ProcessBackends) -> int:
    """Send due deadline reminders and apply the defaults of passed deadlines; return the turns handled.

    The sweep is `AgentRunner.apply_due_deadlines`, the one the embedded `AgentWorker`
    runs too; a turn resumed by its default is enqueued by the runner's dispatcher like any resume.
    """
    return wiring.runner.apply_due_deadlines(SWEEP_BATCH)


def _resend(wiring: ProcessBackends, ref: TurnRef) -> int:
    """Send a step for `ref` unless a live worker holds its lease; 1 if sent."""
    try:
        if wiring.lease.holder(ref.turn_id) is not None:
            return 0  # a live worker is on it (a long model call); its lease expires if it dies
    except AgentRunnerError as exc:
        logger.warning("could not read the lease of turn %s, sending anyway: %s", ref.turn_id, exc)
    if wiring.admission is not None and _is_new(ref):
        return _line_up_again(wiring, ref)
    return int(wiring.dispatcher.send_step(ref.turn_id, ref.version))


def _line_up_again(wiring: ProcessBackends, ref: TurnRef) -> int:
    """Line a new turn up for admission again (a no-op if it waits or is admitted); 1 if it was sent at once."""
    assert wiring.admission is not None
    try:
        turn = wiring.turn_store.load(ref.turn_id)
    except AgentRunnerError as exc:
        logger.warning("could not load turn %s to line it up for admission: %s", ref.turn_id, exc)
        return 0
    if wiring.admission.enqueue(turn) is not None:
        return 0
    return int(wiring.dispatcher.send_step(ref.turn_id, ref.version))


def sweep_admission(wiring: ProcessBackends) -> int:
    """Give back the slots of admitted turns that never started and fill the window again; return the turns sent."""
    return 0 if wiring.admission is None else wiring.admission.pump()


DELIVERIES_PER_RUN = 20
"""Webhook attempts one run makes at most, so that a slow receiver holds a worker slot for a few
timeouts at most; the next run takes the rest."""

_deliverers: dict[int, WebhookDeliverer] = {}
_deliverers_lock = threading.Lock()


def deliver_webhooks(wiring: ProcessBackends) -> int:
    """Find new events owed to webhooks and make the due attempts; return how many were delivered.

    Retries and backoff live in the delivery log (`store.webhooks`), not in Celery: a failed
    attempt is rescheduled there with its backoff, so it survives a worker restart.
    """
    # One per process: the delivery log remembers how far it has looked (a fork starts afresh).
    with _deliverers_lock:
        deliverer = _deliverers.get(os.getpid())
        if deliverer is None:
            deliverer = build_deliverer(wiring.settings.webhooks, wiring.engine)
            if deliverer is None:
                return 0  # no webhook is configured
            _deliverers[os.getpid()] = deliverer
    return deliverer.run_once(DELIVERIES_PER_RUN)


def _apply_deadlines(runner: AgentRunner, deliverer: WebhookDeliverer | None) -> int:
    return runner.apply_due_deadlines(SWEEP_BATCH)


def _deliver(runner: AgentRunner, deliverer: WebhookDeliverer | None) -> int:
    return 0 if deliverer is None else deliverer.run_once(DELIVERIES_PER_RUN)


EmbeddedRun = Callable[[AgentRunner, WebhookDeliverer | None], int]
"""What an embedded process runs for a sweep: its runner and its webhook deliverer (None without webhooks)."""


@dataclass(frozen=True)
class Sweep:
    """One periodic sweep: what it runs under Celery and in an embedded process, and how often."""

    name: str
    """Its `sweep` label in the metrics; its beat entry is named after its task."""
    task: str
    """The name of its Celery task. Messages in queues carry it, so it is never renamed."""
    run: Callable[[ProcessBackends], int]
    """What a Celery worker runs; it returns how many items it sent on (the metrics count them)."""
    setting: str
    """The environment variable of its interval."""
    interval: Callable[[WorkerSettings], float | None]
    """Seconds between two runs under these settings; None: it does not run."""
    embedded: EmbeddedRun | None
    """What the `AgentWorker` of an embedded process runs for it, at the same interval; None when
    that process does its job otherwise (its `AgentWorker` finds stale and due turns when it polls
    the store, its `InboxPump` sweeps the inbox, and it has no admission)."""

    @property
    def counted(self) -> bool:
        """Whether its runs are counted in the sweep metrics (`SWEEP_LABELS` names it)."""
        return self.name in SWEEP_LABELS

    @property
    def beat_entry(self) -> str:
        """The name of its entry in beat's schedule (`agent_runner.sweep_inbox` -> `agent-runner-sweep-inbox`)."""
        return self.task.replace("_", "-").replace(".", "-")


def _webhook_interval(settings: WorkerSettings) -> float | None:
    return None if settings.webhooks is None else settings.webhooks.interval_s


def _admission_interval(settings: WorkerSettings) -> float | None:
    return None if settings.admission_window is None else settings.sweep_interval_s


SWEEPS: tuple[Sweep, ...] = (
    Sweep(
        "inbox",
        SWEEP_INBOX,
        sweep_inbox,
        "AGENT_RUNNER_SWEEP_INTERVAL_S",
        lambda settings: settings.sweep_interval_s,
        embedded=None,
    ),
    Sweep(
        "stale_turns",
        SWEEP_STALE_TURNS,
        sweep_stale_turns,
        "AGENT_RUNNER_SWEEP_INTERVAL_S",
        lambda settings: settings.sweep_interval_s,
        embedded=None,
    ),
    Sweep(
        "due_retries",
        SWEEP_DUE_RETRIES,
        sweep_due_retries,
        "AGENT_RUNNER_SWEEP_INTERVAL_S",
        lambda settings: settings.sweep_interval_s,
        embedded=None,
    ),
    Sweep(
        DEADLINE_SWEEP,
        SWEEP_DEADLINES,
        sweep_deadlines,
        "AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S",
        lambda settings: settings.deadline_sweep_interval_s,
        embedded=_apply_deadlines,
    ),
    Sweep(
        "admission",
        SWEEP_ADMISSION,
        sweep_admission,
        "AGENT_RUNNER_SWEEP_INTERVAL_S",
        _admission_interval,
        embedded=None,
    ),
    Sweep(
        "webhooks",
        DELIVER_WEBHOOKS,
        deliver_webhooks,
        "AGENT_RUNNER_WEBHOOK_INTERVAL_S",
        _webhook_interval,
        embedded=_deliver,
    ),
)
"""Every periodic sweep, in the order beat lists them."""


def embedded_sweeps(
    runner: AgentRunner, settings: WorkerSettings, deliverer: WebhookDeliverer | None
) -> tuple[PeriodicSweep, ...]:
    """The sweeps of `SWEEPS` an embedded process's `AgentWorker` runs under `settings`, each at its interval there.

    Those with an embedded run that runs under these settings (the webhooks only when some are configured).
    """
    chosen: list[PeriodicSweep] = []
    for sweep in SWEEPS:
        interval = sweep.interval(settings)
        if sweep.embedded is not None and interval is not None:
            chosen.append(PeriodicSweep(sweep.name, interval, partial(sweep.embedded, runner, deliverer)))
    return tuple(chosen)
