"""`AgentWorker`: the embedded worker that advances runnable turns on background threads.

It polls the turn store for READY, RUNNING and due RETRY_SCHEDULED turns, takes each
turn's lease before touching it, stamps the lease's fencing number on every save, renews
the lease on a heartbeat while a long model or tool call runs, and releases it when the
turn blocks or ends. A worker that dies leaves its turns RUNNING with a lease that simply
expires; any other worker then picks them up. With the SQL store and the SQL lease this
runs a whole deployment in one process with SQLite and no Redis or Celery.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from agent_runner._base import new_id
from agent_runner.errors import AgentRunnerError, LeaseLostError, TurnNotFound, VersionConflictError
from agent_runner.in_memory import InMemoryTurnLease
from agent_runner.persistence import Lease, TurnLease
from agent_runner.runner import AgentRunner
from agent_runner.snapshot import AgentTurn, AgentTurnStatus

logger = logging.getLogger("agent_runner.worker")


class AgentWorker:
    """Advances runnable turns of `runner`'s store under per-turn leases.

    Args:
        runner: The runner whose store, agents and policy are used. If it has no dispatcher,
            the worker becomes its dispatcher: turns started, resumed with `submit_resume`,
            child turns and parents whose children ended are then run by this worker (on its
            threads) instead of inline.
        lease: Per-turn mutual exclusion shared by every worker on the store (default: an
            in-process lease, enough for workers of one process).
        concurrency: Number of threads stepping turns.
        lease_ttl: Seconds a lease lasts without renewal; a dead worker's turns are picked up
            by others after this long. Renewed every `lease_ttl / 3` while a step runs.
        poll_interval: Seconds between polls of the store when there is nothing to do.
        max_steps_per_claim: Steps one turn may take under one lease before the worker lets
            other turns go first.
        batch_size: Runnable turns fetched per poll.
    """

    def __init__(
        self,
        runner: AgentRunner,
        lease: TurnLease | None = None,
        concurrency: int = 1,
        *,
        lease_ttl: float = 30.0,
        poll_interval: float = 0.2,
        max_steps_per_claim: int = 100,
        batch_size: int = 50,
        owner: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if lease_ttl <= 0 or poll_interval <= 0:
            raise ValueError("lease_ttl and poll_interval must be positive")
        self.runner = runner
        self.lease: TurnLease = lease if lease is not None else InMemoryTurnLease()
        self.concurrency = concurrency
        self.lease_ttl_ms = int(lease_ttl * 1000)
        self.poll_interval = poll_interval
        self.max_steps_per_claim = max_steps_per_claim
        self.batch_size = batch_size
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{new_id()[:8]}"
        if runner.dispatcher is None:
            runner.dispatcher = self
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._held: dict[str, Lease] = {}
        self._lost: set[str] = set()
        self._held_lock = threading.Lock()

    # --- Dispatcher ---------------------------------------------------------------------------

    def dispatch(self, turn: AgentTurn) -> None:
        """Wake the polling threads: a turn became runnable."""
        self._wake.set()

    # --- Running ------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Step every runnable turn this worker can lease, each until it blocks or ends; return the steps made."""
        steps = 0
        refs = self.runner.turn_store.list_runnable(self.runner.clock(), self.batch_size)
        for ref in refs:
            if self._stopping.is_set():
                break
            steps += self._advance(ref.turn_id)
        return steps

    def start(self) -> None:
        """Start the stepping threads and the lease heartbeat."""
        if self._threads:
            return
        self._stopping.clear()
        for index in range(self.concurrency):
            thread = threading.Thread(target=self._loop, name=f"agent-worker-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        heartbeat = threading.Thread(target=self._heartbeat, name="agent-worker-heartbeat", daemon=True)
        heartbeat.start()
        self._threads.append(heartbeat)

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop after the steps in flight; return False if a thread was still busy after `timeout` seconds."""
        self._stopping.set()
        self._wake.set()
        per_thread = timeout / max(1, len(self._threads))
        stopped = True
        for thread in self._threads:
            thread.join(per_thread)
            stopped = stopped and not thread.is_alive()
        self._threads = [t for t in self._threads if t.is_alive()]
        return stopped

    def __enter__(self) -> AgentWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                steps = self.run_once()
            except Exception:
                logger.exception("worker poll failed; retrying after %ss", self.poll_interval)
                steps = 0
            if steps == 0:
                self._wake.wait(self.poll_interval)
                self._wake.clear()

    def _heartbeat(self) -> None:
        interval = self.lease_ttl_ms / 3000
        while not self._stopping.wait(interval):
            with self._held_lock:
                held = list(self._held.values())
            for lease in held:
                try:
                    renewed = self.lease.renew(lease, self.lease_ttl_ms)
                except AgentRunnerError as exc:
                    logger.warning("renewing the lease of turn %s failed: %s", lease.turn_id, exc)
                    continue
                if not renewed:
                    with self._held_lock:
                        self._lost.add(lease.turn_id)
                    logger.warning("lost the lease of turn %s; its next save will be refused", lease.turn_id)

    @contextmanager
    def _leased(self, turn_id: str) -> Iterator[Lease | None]:
        try:
            lease = self.lease.acquire(turn_id, self.owner, self.lease_ttl_ms)
        except AgentRunnerError as exc:
            logger.warning("could not ask for the lease of turn %s: %s", turn_id, exc)
            lease = None
        if lease is None:
            yield None
            return
        with self._held_lock:
            self._held[turn_id] = lease
            self._lost.discard(turn_id)
        try:
            yield lease
        finally:
            with self._held_lock:
                self._held.pop(turn_id, None)
                self._lost.discard(turn_id)
            try:
                self.lease.release(lease)
            except AgentRunnerError as exc:
                logger.warning("releasing the lease of turn %s failed (it will expire): %s", turn_id, exc)

    def _advance(self, turn_id: str) -> int:
        """Step one turn under its lease until it blocks, ends, or used its share of steps."""
        with self._leased(turn_id) as lease:
            if lease is None:
                return 0
            try:
                turn = self.runner.turn_store.load(turn_id)
            except TurnNotFound:
                return 0
            steps = 0
            first = True
            while steps < self.max_steps_per_claim and not self._stopping.is_set():
                runnable = turn.status in (AgentTurnStatus.READY, AgentTurnStatus.RUNNING) or (
                    first and turn.is_runnable(self.runner.clock())
                )
                if not runnable:
                    break
                first = False
                with self._held_lock:
                    if turn_id in self._lost:
                        break
                # Every save of this step carries the fence: if the lease was taken over
                # meanwhile, the store refuses the save instead of clobbering newer work.
                fenced = turn.model_copy(update={"lease_fence": lease.fence})
                try:
                    result = self.runner.step(fenced)
                except LeaseLostError:
                    logger.warning("turn %s moved on under another worker's lease; stopping", turn_id)
                    break
                except Exception:
                    logger.exception("step of turn %s failed; it stays runnable and will be retried", turn_id)
                    break
                steps += 1
                turn = result.turn
                if isinstance(result.error, VersionConflictError):
                    break
            return steps
