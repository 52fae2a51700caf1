"""The periodic sweeps an `AgentWorker` runs beside its stepping threads, and the thread that times them.

A worker on its own sweeps approval and form deadlines (`deadline_sweep`); a deployment
gives its worker the rows of its sweep table instead (`workers.sweeps.embedded_sweeps`),
so a sweep added to that table runs in an embedded process without a timer of its own.
Each sweep runs when the thread starts, then once per interval; one that fails is logged
and runs again at its next time. The sweeps run on a thread of their own, so a slow one (a
webhook receiver that does not answer) holds back no step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_runner.errors import log_failure

if TYPE_CHECKING:
    from agent_runner.runner import AgentRunner

logger = logging.getLogger("agent_runner.worker")

DEADLINE_SWEEP = "deadlines"
"""The name of the deadline sweep."""


@dataclass(frozen=True)
class PeriodicSweep:
    """A sweep run every `interval` seconds: `run` returns how many items it handled."""

    name: str
    interval: float
    run: Callable[[], int]

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ValueError(f"the interval of sweep {self.name!r} must be positive, got {self.interval!r}")


def deadline_sweep(runner: AgentRunner, interval: float, limit: int = 100) -> PeriodicSweep:
    """The deadline sweep of `runner` (`AgentRunner.apply_due_deadlines`, up to `limit` turns a run) every `interval` seconds."""
    return PeriodicSweep(DEADLINE_SWEEP, interval, lambda: runner.apply_due_deadlines(limit))


class SweepThread:
    """Runs `sweeps`, each once per its interval, on one thread between `start` and `stop`.

    Args:
        sweeps: The sweeps, each named once.
        clock: Monotonic seconds; tests pass their own.

    Raises:
        ValueError: Two sweeps have one name.
    """

    def __init__(self, sweeps: Sequence[PeriodicSweep], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.sweeps = {sweep.name: sweep for sweep in sweeps}
        if len(self.sweeps) != len(sweeps):
            raise ValueError(f"each sweep needs a name of its own, got {[sweep.name for sweep in sweeps]}")
        self.clock = clock
        self._next: dict[str, float] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def intervals(self) -> dict[str, float]:
        """Sweep name -> seconds between its runs."""
        return {name: sweep.interval for name, sweep in self.sweeps.items()}

    def run_all(self) -> dict[str, int]:
        """Run every sweep now, in this thread; return sweep name -> what it handled.

        Raises:
            Exception: What a sweep raised (the sweeps after it did not run).
        """
        return {name: sweep.run() for name, sweep in self.sweeps.items()}

    def run_due(self) -> dict[str, int]:
        """Run every sweep whose time has come; return sweep name -> what it handled, for those that ran and did not fail."""
        now = self.clock()
        ran: dict[str, int] = {}
        for name, sweep in self.sweeps.items():
            if self._next.get(name, now) > now:
                continue
            self._next[name] = now + sweep.interval
            try:
                ran[name] = sweep.run()
            except Exception as exc:
                # The store is down or the sweep hit a bug: the next run tries again.
                log_failure(logger, exc, "the %s sweep failed; it runs again in %gs", name, sweep.interval)
        return ran

    @property
    def is_running(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (none without sweeps, and a no-op while it runs)."""
        if not self.sweeps or self.is_running:
            return
        self._stopping = threading.Event()
        self._next.clear()  # what came due while nothing ran is swept at once
        self._thread = threading.Thread(
            target=self._loop, args=(self._stopping,), name="agent-runner-sweeps", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the thread, waiting up to `timeout` seconds for a sweep being run; True when it stopped."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(max(0.0, timeout))
        return not thread.is_alive()

    def _loop(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            self.run_due()
            wait = min(self._next.values(), default=self.clock()) - self.clock()
            stopping.wait(max(wait, 0.01))
