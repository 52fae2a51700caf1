"""`LeaseKeeper`: holds turn leases for a process and renews them while steps run; `TurnHolder`: how a process steps a turn delivered to it.

Both workers use them: the embedded `AgentWorker` and the Celery `step_turn` task. A step may
outlast the lease TTL (a slow model call), so one heartbeat thread renews every held lease
every third of the TTL. A lease whose renewal is refused is marked lost; a lease whose
renewals keep failing (the backend is down) grows old. Either way `may_step` says no, and
the holder starts no new step; any save it still makes is refused by the store's fence
check once another holder has saved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from agent_runner.persistence import Lease, TurnLease
from agent_runner.results import Delivery
from agent_runner.snapshot import AgentTurn

logger = logging.getLogger("agent_runner.leasing")


@dataclass(eq=False)
class HeldLease:
    """A lease held through a `LeaseKeeper`, with the state of its renewals."""

    lease: Lease
    renewed_at: float = field(default_factory=time.monotonic)
    """`time.monotonic()` when the last successful acquire or renew was *sent*.

    The lease lasts its TTL from when the backend handled the request, which is no earlier
    than this, so counting from here never overestimates the time left."""
    lost: bool = False
    """A renewal was refused: another owner may hold the lease now."""

    @property
    def turn_id(self) -> str:
        """The leased turn."""
        return self.lease.turn_id

    @property
    def fence(self) -> int:
        """The lease's fencing number, stamped on every save made under it."""
        return self.lease.fence


@dataclass(frozen=True)
class TurnHolder:
    """How one kind of process holds and steps the turns delivered to it (`AgentRunner.deliver`).

    The delivery itself (lease, pick-up, the version and runnable checks, `advance`, release)
    is the same for every holder; these values are what differs between them.
    """

    hold: Callable[[str], AbstractContextManager[HeldLease | None]]
    """Holds the turn's lease for a `with` block, renewed meanwhile; yields None when it is held elsewhere."""
    may_step: Callable[[HeldLease], bool]
    """Whether the held lease (and the holder: a stopping worker) allows one more step."""
    max_steps: int | None = None
    """Most steps one delivery makes."""
    seconds: float | None = None
    """Seconds after which one delivery starts no further step (the first always may)."""
    picked_up: Callable[[AgentTurn], None] | None = None
    """Told the snapshot a delivery steps from, at its delivered version, before any step."""
    then: Callable[[Delivery], None] | None = None
    """The follow-up, told what the delivery did once the lease is released: a continuation is
    sent from here, since one sent while the lease is held could arrive at once and find it held."""


class LeaseKeeper:
    """Takes, renews and releases turn leases for the stepping threads of one process.

    Args:
        lease: The lease backend shared by every worker of the deployment.
        ttl_ms: How long a lease lasts without renewal; renewed every third of it.
        name: Owner of the log lines and name of the heartbeat thread.
    """

    def __init__(self, lease: TurnLease, ttl_ms: int, *, name: str = "agent-runner") -> None:
        if ttl_ms < 1:
            raise ValueError(f"ttl_ms must be at least 1, got {ttl_ms}")
        self.lease = lease
        self.ttl_ms = ttl_ms
        self.name = name
        self._lock = threading.Lock()
        self._held: set[HeldLease] = set()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> int:
        """How many leases are held right now."""
        with self._lock:
            return len(self._held)

    def acquire(self, turn_id: str, owner: str) -> HeldLease | None:
        """Take the turn's lease for `owner` and keep it renewed; None when another owner holds it.

        Raises:
            StoreError: The lease backend failed (typically `StoreUnavailableError`).
        """
        sent = time.monotonic()
        lease = self.lease.acquire(turn_id, owner, self.ttl_ms)
        if lease is None:
            return None
        held = HeldLease(lease, renewed_at=sent)
        with self._lock:
            self._held.add(held)
            if self._thread is None or not self._thread.is_alive():
                self._wake.clear()
                self._thread = threading.Thread(target=self._beat, name=f"{self.name}-heartbeat", daemon=True)
                self._thread.start()
        return held

    @contextmanager
    def holding(self, turn_id: str, owner: str) -> Iterator[HeldLease | None]:
        """`acquire` for a `with` block, released at its end; yields None when another owner holds the lease.

        Raises:
            StoreError: The lease backend failed while acquiring (typically `StoreUnavailableError`).
        """
        held = self.acquire(turn_id, owner)
        if held is None:
            yield None
            return
        try:
            yield held
        finally:
            self.release(held)

    def release(self, held: HeldLease) -> None:
        """Stop renewing the lease and give it up; a failure is logged (the lease then expires by itself)."""
        # Forget it before releasing: once released another worker may take the turn, and
        # the heartbeat must neither renew nor count as lost a lease that is no longer ours.
        # With nothing left, the heartbeat thread ends at its next beat rather than at once, so
        # a worker going from one turn to the next keeps one thread instead of one per turn.
        with self._lock:
            self._held.discard(held)
        try:
            self.lease.release(held.lease)
        except Exception as exc:
            logger.warning(
                "%s: releasing the lease of turn %s failed (it expires on its own): %s", self.name, held.turn_id, exc
            )

    def may_step(self, held: HeldLease) -> bool:
        """Whether the lease is safely ours for the start of another step."""
        if held.lost:
            logger.warning("%s: lost the lease of turn %s; leaving it", self.name, held.turn_id)
            return False
        # Renewals go out every TTL/3. Past two thirds of the TTL without one that succeeded,
        # the backend is failing and the lease may run out mid-step: start nothing new.
        age = time.monotonic() - held.renewed_at
        if age * 1000 > self.ttl_ms * 2 / 3:
            logger.warning(
                "%s: the lease of turn %s was last renewed %.1fs ago; leaving it", self.name, held.turn_id, age
            )
            return False
        return True

    def stop(self, timeout: float = 1.0) -> None:
        """End the heartbeat thread if nothing is held (it also ends by itself once idle)."""
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _beat(self) -> None:
        interval = self.ttl_ms / 3000
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            with self._lock:
                if not self._held:
                    # Decided under the lock that `acquire` takes, so a lease taken right now
                    # starts a new thread instead of being left unrenewed.
                    self._thread = None
                    return
                held = [h for h in self._held if not h.lost]
            for item in held:
                self._renew(item)

    def _renew(self, held: HeldLease) -> None:
        sent = time.monotonic()
        try:
            renewed = self.lease.renew(held.lease, self.ttl_ms)
        except Exception as exc:
            # Not lost yet: the next beat may reach the backend in time. If the outage
            # outlasts the TTL, `may_step` stops further steps.
            logger.warning("%s: renewing the lease of turn %s failed: %s", self.name, held.turn_id, exc)
            return
        with self._lock:
            if held not in self._held:
                return  # released meanwhile
            if renewed:
                held.renewed_at = sent
            else:
                held.lost = True
        if not renewed:
            logger.warning(
                "%s: the lease of turn %s expired or was taken over; its next save may be refused",
                self.name,
                held.turn_id,
            )
