"""Sending work to the Celery workers: `CeleryDispatcher` and the inbox notifier."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from agent_runner import AgentEvent, AgentTurn, AgentTurnStatus
from agent_runner.ids import utcnow
from agent_runner.persistence import ConversationKey
from workers.celery_app.names import DISPATCH_INBOX, STEP_TURN
from workers.celery_app.outbox import MessageOutbox, send_task_or_log
from workers.settings import WorkerSettings

if TYPE_CHECKING:
    from workers.celery_app.admission import TurnAdmission

logger = logging.getLogger("workers")


class CeleryDispatcher:
    """A `TurnDispatcher` that sends `step_turn` messages to the Celery queue.

    Duplicates are harmless (`step_turn` is idempotent), so the dispatcher never tries to
    avoid them. A retry or a delayed start waiting longer than `max_eta_s` is not sent at
    all: with the Redis broker a message whose ETA lies beyond the visibility timeout is
    redelivered again and again while it waits, so long waits are left to the due-retry
    sweep, which reads `next_retry_at` from the store. A failed publish is logged, not raised: the turn is
    already saved, and the sweeps re-enqueue it.

    Args:
        celery_app: The app whose broker receives the messages.
        settings: Queue name and ETA limit.
        clock: The current UTC time.
        outbox: Sends the messages from a thread of its own, several per round trip (the
            HTTP server's choice: a request then never waits for the broker); None sends
            each in the calling thread.

    Attributes:
        admission: Fair admission of new turns (`AGENT_RUNNER_ADMISSION_WINDOW`): a new turn
            is lined up there instead of being sent at once; None sends every new turn at once.
    """

    def __init__(
        self,
        celery_app: Any,
        settings: WorkerSettings,
        clock: Callable[[], datetime] = utcnow,
        *,
        outbox: MessageOutbox | None = None,
    ) -> None:
        self.celery_app = celery_app
        self.queue = settings.queue
        self.max_eta = timedelta(seconds=settings.max_eta_s)
        self.clock = clock
        self.outbox = outbox
        self.admission: TurnAdmission | None = None

    def dispatch(self, turn: AgentTurn) -> None:
        """Enqueue a step of `turn` if it is runnable now, or is a retry or a delayed start due within the ETA limit.

        Under admission a new turn (READY, never saved since it was created) waits for its
        tenant's fair turn instead; it is sent at once when the admission cannot be reached.
        """
        if turn.status is AgentTurnStatus.RETRY_SCHEDULED or turn.starts_at is not None:
            self.send_step(turn.id, turn.version, eta=turn.next_retry_at)
        elif turn.is_runnable(self.clock()):
            if self.admission is not None and turn.version == 0 and turn.status is AgentTurnStatus.READY:
                if self.admission.enqueue(turn) is not None:
                    return
            self.send_step(turn.id, turn.version)

    def send_step(self, turn_id: str, version: int, *, eta: datetime | None = None) -> bool:
        """Send `step_turn(turn_id, version)`, delayed until `eta` if it lies ahead; False if not sent.

        With an outbox the message is only queued here (True), and a failure to send it is logged by the outbox.
        """
        options: dict[str, Any] = {"queue": self.queue}
        if eta is not None:
            now = self.clock()
            if eta - now > self.max_eta:
                logger.debug("turn %s is due at %s, beyond the ETA limit: left to the sweep", turn_id, eta)
                return False
            if eta > now:
                options["eta"] = eta
        return self._send(STEP_TURN, (turn_id, version), options)

    def send_inbox(self, conversation: ConversationKey) -> bool:
        """Send `dispatch_inbox(conversation_id, tenant_id)` for the conversation; False if not sent."""
        args: tuple[str, ...] = (conversation.conversation_id,)
        if conversation.tenant_id is not None:
            args += (conversation.tenant_id,)
        return self._send(DISPATCH_INBOX, args, {"queue": self.queue})

    def _send(self, name: str, args: tuple[Any, ...], options: dict[str, Any]) -> bool:
        if self.outbox is not None:
            return self.outbox.put(name, args, options)
        return send_task_or_log(self.celery_app, name, args, options)


class InboxNotifier:
    """An event listener that asks for the conversation's next inbox message when a turn ends.

    It only sends a message; it never drives the runner, which is still inside the step
    that emitted the event. With `has_waiting` (`store.Inbox.has_waiting`) it sends one
    only when the conversation has a message waiting: most conversation turns end with
    none, and a `dispatch_inbox` task that finds nothing costs a worker a whole task. A
    message queued after the check asks for itself (whoever queues a message sends
    `dispatch_inbox` after it is stored), and when the check cannot be made the message is
    sent anyway.
    """

    def __init__(
        self, dispatcher: CeleryDispatcher, has_waiting: Callable[[ConversationKey], bool] | None = None
    ) -> None:
        self.dispatcher = dispatcher
        self.has_waiting = has_waiting

    def __call__(self, event: AgentEvent) -> None:
        """Send `dispatch_inbox` for a terminal event of a conversation turn whose conversation has a message waiting."""
        if not event.type.is_terminal or event.conversation_id is None:
            return
        conversation = ConversationKey(event.conversation_id, event.tenant_id)
        if self.has_waiting is not None:
            try:
                if not self.has_waiting(conversation):
                    return
            except Exception:
                logger.warning("could not read the inbox of %s; asking for its next message anyway", conversation)
        self.dispatcher.send_inbox(conversation)
