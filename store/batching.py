"""`BatchingThread`: items handed to a thread of their own, which sends what is queued by then as one batch."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Generic, TypeVar

logger = logging.getLogger("store")

Item = TypeVar("Item")


class BatchingThread(Generic[Item]):
    """The queue and thread behind a sender that must not make its callers wait on the network.

    `_offer` queues an item and returns at once; the thread takes everything queued by
    then (at most `max_batch` items) and passes it to `_send_batch`, in the order queued,
    so under load many items share one round trip. The thread starts with the first item
    (so a process that forks after building this starts its own) and ends on `close`,
    which first sends what is queued. Subclasses say what a batch is sent with, and what
    to do with an item `_offer` refuses (the queue is full, or closed).

    With a `pause_s`, a batch starts at least that long after the start of the one before:
    an item that comes after a quiet spell goes out at once, but under a steady flow the
    items of `pause_s` share one batch, which costs the sender a fraction of what many
    small ones do, for at most `pause_s` more delay.

    Args:
        name: The thread's name.
        max_pending: Most items waiting for the thread.
        max_batch: Most items sent in one batch (None: all that wait).
        pause_s: Least time from the start of a batch to the start of the next.

    Raises:
        ValueError: `max_pending` or `max_batch` is below one, or `pause_s` is negative.
    """

    def __init__(self, name: str, *, max_pending: int, max_batch: int | None = None, pause_s: float = 0.0) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending!r}")
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch!r}")
        if pause_s < 0:
            raise ValueError(f"pause_s must not be negative, got {pause_s!r}")
        self.name = name
        self.max_pending = max_pending
        self.max_batch = max_batch
        self.pause_s = pause_s
        self._pending: deque[Item] = deque()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False
        self._sending = False

    def _offer(self, item: Item) -> bool:
        """Queue `item` for the thread; False, queuing nothing, when `max_pending` items wait or after `close`."""
        with self._ready:
            if self._closed or len(self._pending) >= self.max_pending:
                return False
            self._pending.append(item)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._ready.notify()
            return True

    def _send_batch(self, batch: list[Item]) -> None:
        """Send `batch`, in its order (called on the thread)."""
        raise NotImplementedError

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far was sent (or failed); False if `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        with self._ready:
            while self._pending or self._sending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    return not (self._pending or self._sending)
                self._ready.wait(remaining)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (waiting at most `timeout` seconds), then stop the thread."""
        self.flush(timeout)
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and self._pid == os.getpid():
            thread.join(timeout)

    def _run(self) -> None:
        started = -self.pause_s  # when the last batch started (monotonic clock)
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending:
                    return
                closing = self._closed
            pause = started + self.pause_s - time.monotonic()
            if pause > 0 and not closing:
                # Outside the lock, and not waiting on the condition: an item queued
                # meanwhile joins the batch without waking the thread.
                time.sleep(pause)
            with self._ready:
                size = len(self._pending) if self.max_batch is None else min(self.max_batch, len(self._pending))
                batch = [self._pending.popleft() for _ in range(size)]
                self._sending = True
            started = time.monotonic()
            try:
                self._send_batch(batch)
            except Exception:  # the thread must outlive any surprise of a sender
                logger.exception("%s: sending %d queued items failed; they are dropped", self.name, len(batch))
            finally:
                with self._ready:
                    self._sending = False
                    self._ready.notify_all()
