"""The Celery tasks that advance turns: `step_turn` and `dispatch_inbox`.

Both are thin: they take a lease or a claim, call the runner, and let the runner's
dispatcher enqueue whatever became runnable. Both are idempotent, because every broker
here delivers at least once: a message may arrive twice, late, or after its turn moved on.

`step_turn(turn_id, version)` is one delivery of `AgentRunner.deliver`, the one the embedded
`AgentWorker` makes too (lease, load, the version and runnable checks, `advance` under the
lease's fence, release). What is the task's own comes in its `TurnHolder`:

- the lease is taken under an owner of this delivery alone and renewed by the process's
  `LeaseKeeper`; the step budget is `AGENT_RUNNER_STEPS_PER_TASK` steps and half
  the task's soft time limit;
- a new turn's first delivery tells the admission it started (or will never run);
- after the lease is released, exactly one follow-up is enqueued if the turn is runnable:
  when the step budget ran out, for the version this task saved last; when the turn stopped
  waiting, after reading its header again (status, version and retry time; no messages),
  since someone may have resumed it while the lease was held and their message was dropped
  as lease-held. A retry delivered before its time gets its ETA message back.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial

from celery import Celery

from agent_runner import (
    AgentRunnerError,
    AgentTurn,
    AgentTurnStatus,
    StopReason,
    StoreUnavailableError,
)
from agent_runner.leasing import TurnHolder
from agent_runner.limits import ConversationId
from agent_runner.persistence import ConversationKey
from agent_runner.results import Delivery, DeliveryOutcome
from agent_runner.snapshot import RUNNABLE_STATUSES
from workers import inbox
from workers.celery_app.admission import TurnAdmission
from workers.celery_app.names import DISPATCH_INBOX, STEP_TURN
from workers.celery_app.process import current
from workers.celery_app.task_arguments import TenantId, checked_arguments
from workers.inbox import InboxOutcome
from workers.telemetry import record_lease_takeover
from workers.wiring import ProcessBackends

logger = logging.getLogger("workers.tasks")

_OWNER_PREFIX = f"{socket.gethostname()}:{os.getpid()}"
_RELEASE_MARGIN = timedelta(seconds=0.25)
_TRANSIENT_RETRY_DELAY = timedelta(seconds=1)


StepOutcome = DeliveryOutcome
"""What one `step_turn` delivery did (the task's return value, shown in the worker log)."""


# --- step_turn --------------------------------------------------------------------------------


def deliver_step_turn(wiring: ProcessBackends, turn_id: str, version: int) -> StepOutcome:
    """Run one `step_turn` delivery against `wiring` (see the module docstring).

    Raises:
        StoreUnavailableError: The lease backend or the database could not be reached
            before anything was done; the delivery may be retried.
    """
    settings, keeper = wiring.settings, wiring.keeper
    admission = wiring.admission if version == 0 else None
    holder = TurnHolder(
        hold=lambda turn_id: keeper.holding(turn_id, _owner()),
        may_step=keeper.may_step,
        max_steps=settings.steps_per_task,
        seconds=settings.step_time_budget_s,
        picked_up=None if admission is None else partial(_report_start, admission, wiring.runner.clock),
        then=partial(_after_delivery, wiring, admission),
    )
    return wiring.runner.deliver(turn_id, holder, version=version).outcome


def _owner() -> str:
    """A lease owner of one delivery alone.

    Two deliveries of one turn in one process (a thread pool) then exclude each other like
    two processes would.
    """
    return f"{_OWNER_PREFIX}:{uuid.uuid4().hex[:12]}"


def _report_start(admission: TurnAdmission, clock: Callable[[], datetime], turn: AgentTurn) -> None:
    """A new turn's first step was delivered: its admission slot frees, and it counts as active if it runs now."""
    if turn.is_runnable(clock()) and turn.starts_at is None:
        admission.start(turn.id, turn.tenant_id)
    elif turn.status is not AgentTurnStatus.READY:
        admission.release(turn.id)  # cancelled before it started: it will never run


def _after_delivery(wiring: ProcessBackends, admission: TurnAdmission | None, delivery: Delivery) -> None:
    """What follows a delivery once the lease is released: a follow-up step, or telemetry."""
    if delivery.outcome is DeliveryOutcome.NOT_FOUND and admission is not None:
        admission.release(delivery.turn_id)
    elif delivery.outcome is DeliveryOutcome.NOT_DUE and delivery.turn is not None:
        # A retry or a delayed start delivered early (clock skew between machines, a
        # duplicate): put the ETA back so it is not left to the slower sweep.
        wiring.dispatcher.dispatch(delivery.turn)
    elif delivery.result is not None:
        if delivery.lease_lost:
            record_lease_takeover()  # another worker took this turn's lease over mid-task
        result = delivery.result
        # After a failed step the snapshot in the store is intact (every save is atomic): the
        # turn stays as last saved, and the follow-up decides when to try again.
        _follow_up(wiring, result.turn, result.error if result.stopped is StopReason.FAILED else None)


def _follow_up(wiring: ProcessBackends, last: AgentTurn, error: Exception | None) -> None:
    """After the lease is released, enqueue one more step if the turn is runnable now."""
    now = wiring.runner.clock()
    if error is not None:
        if isinstance(error, AgentRunnerError) and error.retryable:
            # A database or Redis blip: try again shortly.
            wiring.dispatcher.send_step(last.id, last.version, eta=now + _TRANSIENT_RETRY_DELAY)
        else:
            # Not transient (an agent this worker does not know, a bug): an immediate
            # follow-up would fail the same way in a hot loop. The stale-turn sweep retries
            # it once per sweep interval, after a lease TTL.
            logger.error("turn %s is left to the stale-turn sweep after %s", last.id, type(error).__name__)
        return
    if last.status in RUNNABLE_STATUSES:
        # The budget ran out (or the lease was lost). No read is needed: while this task held
        # the lease, nobody else could step the turn, and a save made since then gives it a
        # newer version, which turns this message into a stale no-op.
        wiring.dispatcher.send_step(last.id, last.version)
        return
    if last.is_terminal:
        return  # an ended turn is never resumed
    try:
        # Waiting or a scheduled retry: a resume may have come while the lease was held. The
        # header alone decides; a full load would read and validate the whole history.
        latest = wiring.turn_store.get_ref(last.id)
    except AgentRunnerError as exc:
        logger.warning("could not re-read turn %s after stepping (the sweeps will check it): %s", last.id, exc)
        return
    if latest.status is AgentTurnStatus.RETRY_SCHEDULED and latest.version == last.version:
        # Scheduled by this task: the runner sent the ETA message already. Only a retry due
        # about now may have been delivered while the lease was still held, and dropped.
        if latest.next_retry_at is None or latest.next_retry_at <= now + _RELEASE_MARGIN:
            wiring.dispatcher.send_step(latest.turn_id, latest.version, eta=latest.next_retry_at)
        return
    if latest.is_runnable(now):
        wiring.dispatcher.send_step(latest.turn_id, latest.version)


@checked_arguments(STEP_TURN, StepOutcome.REJECTED.value)
def _step_turn(turn_id: str, version: int) -> str:
    """`step_turn(turn_id, version)`: advance the turn by up to `AGENT_RUNNER_STEPS_PER_TASK` steps if this delivery is current.

    A no-op for stale and duplicate deliveries.
    """
    return deliver_step_turn(current(), turn_id, version).value


# --- dispatch_inbox ---------------------------------------------------------------------------


def start_next_message(wiring: ProcessBackends, conversation: ConversationKey) -> InboxOutcome:
    """Start a turn from the conversation's next PENDING inbox message, if the conversation is free.

    See `workers.inbox.start_next_message`; messages queued without an agent are answered
    by `AGENT_RUNNER_INBOX_AGENT`.
    """
    return inbox.start_next_message(
        wiring.runner,
        wiring.inbox,
        wiring.settings.inbox_agent,
        conversation,
        ask_again=wiring.dispatcher.send_inbox,
    )


@checked_arguments(DISPATCH_INBOX, InboxOutcome.REJECTED.value)
def _dispatch_inbox(conversation_id: ConversationId, tenant_id: TenantId | None = None) -> str:
    """`dispatch_inbox(conversation_id, tenant_id)`: start a turn from the conversation's next queued message if it is idle."""
    return start_next_message(current(), ConversationKey(conversation_id, tenant_id)).value


def register_turn_tasks(app: Celery) -> None:
    """Register `step_turn` and `dispatch_inbox` on `app`."""
    # Only failures to reach Redis or the database before anything was done reach Celery;
    # the same delivery can simply run again. Not shared: other apps of the process get none.
    retried = {"autoretry_for": (StoreUnavailableError,), "retry_backoff": True, "retry_backoff_max": 60}
    app.task(name=STEP_TURN, shared=False, ignore_result=True, max_retries=10, **retried)(_step_turn)
    app.task(name=DISPATCH_INBOX, shared=False, ignore_result=True, max_retries=10, **retried)(_dispatch_inbox)
