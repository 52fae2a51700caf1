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

    Args:
        name: The thread's name.
        max_pending: Most items waiting for the thread.
        max_batch: Most items sent in one batch (None: all that wait).

    Raises:
        ValueError: `max_pending` or `max_batch` is below one.
    """

    def __init__(self, name: str, *, max_pending: int, max_batch: int | None = None) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending!r}")
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch!r}")
        self.name = name
        self.max_pending = max_pending
        self.max_batch = max_batch
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
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending:
                    return
                size = len(self._pending) if self.max_batch is None else min(self.max_batch, len(self._pending))
                batch = [self._pending.popleft() for _ in range(size)]
                self._sending = True
            try:
                self._send_batch(batch)
            except Exception:  # the thread must outlive any surprise of a sender
                logger.exception("%s: sending %d queued items failed; they are dropped", self.name, len(batch))
            finally:
                with self._ready:
                    self._sending = False
                    self._ready.notify_all()
