"""`CancelWatch`: the cancel flags of every turn a runner is streaming a model answer for."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

from agent_runner.errors import AgentRunnerError
from agent_runner.persistence import AgentTurnStore, CancelFlagSource


class CancelWatch:
    """Reads the cancel flags of the turns streaming in this runner, all at once, at most every `INTERVAL_S`.

    A cancel of a RUNNING turn only sets its stored flag; the streaming call sees it at its
    next delta after the next read. One read serves every streaming turn of the process (a
    worker streaming a thousand answers reads the flags twice a second, not two thousand
    times); a store that is not a `CancelFlagSource` is read turn by turn. A failed read
    keeps the flags of the last good one: the store is the truth, and its blip must not
    break the streams.
    """

    INTERVAL_S = 0.5

    def __init__(self, store: AgentTurnStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._streaming: dict[str, int] = {}  # turn id -> calls streaming for it
        self._cancelled: frozenset[str] = frozenset()
        self._next_read = 0.0
        self._reading = False

    def watch(self, turn_id: str) -> None:
        """A model call of the turn starts streaming; `unwatch` when it ends."""
        with self._lock:
            if not self._streaming:
                self._next_read = time.monotonic() + self.INTERVAL_S  # the first read waits an interval
            self._streaming[turn_id] = self._streaming.get(turn_id, 0) + 1

    def unwatch(self, turn_id: str) -> None:
        """The model call that `watch` announced has ended."""
        with self._lock:
            left = self._streaming.get(turn_id, 0) - 1
            if left > 0:
                self._streaming[turn_id] = left
            else:
                self._streaming.pop(turn_id, None)

    def cancelled(self, turn_id: str) -> bool:
        """Whether the turn's cancel was requested as of the latest read (reading first when one is due)."""
        now = time.monotonic()
        with self._lock:
            due = now >= self._next_read and not self._reading
            if due:
                self._reading, self._next_read = True, now + self.INTERVAL_S
                watched = list(self._streaming)
        if due:
            flagged = None
            try:
                flagged = self._read(watched)
            except AgentRunnerError:
                pass
            finally:
                with self._lock:
                    self._reading = False
                    if flagged is not None:
                        self._cancelled = frozenset(flagged)
        return turn_id in self._cancelled

    def _read(self, turn_ids: Collection[str]) -> set[str]:
        if isinstance(self.store, CancelFlagSource):
            return self.store.cancel_requested_among(turn_ids)
        return {turn_id for turn_id in turn_ids if self.store.get_ref(turn_id).cancel_requested}
