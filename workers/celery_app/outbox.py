"""Sending Celery messages from a thread of their own, many per round trip: `MessageOutbox`.

A process that answers requests (the HTTP server) should not wait for the broker while
it answers: the request has saved what matters (the turn, READY), and every message the
dispatcher sends is one the sweeps send again when it is lost (a READY turn nobody
touched for a lease TTL gets a `step_turn`, an idle conversation with a pending message a
`dispatch_inbox`). So the request only queues its message; a thread sends everything
queued by then in one kombu publish batch, which on Redis is one pipelined round trip for
the whole batch instead of one per message. Duplicates are harmless (`step_turn` and
`dispatch_inbox` are idempotent), which lets a failed batch be sent again message by
message.
"""

from __future__ import annotations

import contextvars
import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from store.batching import BatchingThread

logger = logging.getLogger("workers")


@dataclass(frozen=True)
class _Message:
    name: str
    args: tuple[Any, ...]
    options: dict[str, Any]
    context: contextvars.Context
    """The sender's context: the trace the message is stamped with is the sender's, not the thread's."""


class MessageOutbox(BatchingThread[_Message]):
    """Sends `send_task` messages of a Celery app from a thread of its own, several per round trip.

    `put` queues a message and returns at once. The thread takes everything queued by
    then (at most `max_batch` messages) and publishes it in one kombu publish batch; on a
    broker without batches (RabbitMQ) the messages go out one after the other on one
    connection, still without a round trip each. A batch that fails is sent again message
    by message (some may then arrive twice, which `step_turn` tolerates); a message that
    still fails is logged, like a failed synchronous send, and left to the sweeps.

    Nothing queued is dropped: when `max_pending` messages wait already, or after `close`,
    `put` sends in the caller's thread. The thread starts with the first message (a process
    that forks after building this starts its own) and ends on `close`, which first sends
    what is queued: the server calls it when it stops.

    Args:
        celery_app: The app whose `send_task` sends the messages.
        max_pending: Most messages waiting for the thread.
        max_batch: Most messages published in one batch.
    """

    def __init__(self, celery_app: Any, *, max_pending: int = 10_000, max_batch: int = 500) -> None:
        super().__init__("celery-message-outbox", max_pending=max_pending, max_batch=max_batch)
        self.celery_app = celery_app

    def put(self, name: str, args: tuple[Any, ...], options: dict[str, Any]) -> bool:
        """Queue `send_task(name, args, **options)` for the thread; True unless it had to be sent here and failed."""
        message = _Message(name, args, options, contextvars.copy_context())
        return self._offer(message) or self._send_one(message)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (waiting at most `timeout` seconds), then stop the thread; later messages are sent at once."""
        super().close(timeout)

    def _send_batch(self, batch: list[_Message]) -> None:
        try:
            with self.celery_app.producer_or_acquire() as producer:
                with _publish_batch(producer, len(batch)):
                    for message in batch:
                        message.context.run(self._publish, message, producer)
            return
        except Exception as exc:
            logger.warning(
                "could not send %d messages in one batch (%s: %s); sending them one by one",
                len(batch),
                type(exc).__name__,
                exc,
            )
        for message in batch:
            message.context.run(self._send_one, message)

    def _publish(self, message: _Message, producer: Any) -> None:
        self.celery_app.send_task(message.name, args=message.args, producer=producer, **message.options)

    def _send_one(self, message: _Message) -> bool:
        return send_task_or_log(self.celery_app, message.name, message.args, message.options)


def send_task_or_log(celery_app: Any, name: str, args: tuple[Any, ...], options: dict[str, Any]) -> bool:
    """Send `send_task(name, args, **options)` now; False, with one warning line, when it could not be sent.

    The sweeps send every such message again, so a failure is logged rather than raised.
    """
    try:
        celery_app.send_task(name, args=args, **options)
    except Exception as exc:
        # One line, not a traceback: with the broker down, every message of a sweep fails alike.
        logger.warning("could not send %s%r (%s: %s); the sweeps will pick it up", name, args, type(exc).__name__, exc)
        return False
    return True


def _publish_batch(producer: Any, size: int) -> AbstractContextManager[Any]:
    """The publish batch of `producer` (kombu 5.7 and later), or nothing: then each publish goes out at once."""
    batch = getattr(producer, "batch", None)
    return batch(max_size=max(size, 1)) if callable(batch) else nullcontext()
