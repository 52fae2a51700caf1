"""`AgentWorker`: the embedded worker that advances runnable turns on background threads.

It steps the turns handed to it by the runner's dispatch first, and polls the turn store
for READY, RUNNING and due RETRY_SCHEDULED turns as the safety net (turns made runnable by
other processes, dispatches it did not keep). Either way a turn under way (resumed, retried,
a child, one that used its share of steps) goes before a turn that has not started, so a
backlog of new turns does not hold back the turns already running. On a thread of its own it
runs its periodic sweeps (`agent_runner.periodic`): by default the deadline sweep
(`AgentRunner.apply_due_deadlines`, the one Celery beat runs in distributed deployments):
reminders of approvals and forms near their deadline, and the defaults of those past it,
whose turns it then steps like any resumed turn; an embedded deployment gives it the rows
of its sweep table instead. Each turn goes through `AgentRunner.deliver`, as in a Celery
task: it takes the turn's lease before touching it, stamps the lease's fencing number on
every save, renews the lease on a heartbeat while a long model or tool call runs, and
releases it when the turn blocks or ends. A
worker that dies leaves its turns RUNNING with a lease that simply expires; any other
worker then picks them up. With the SQL store and the SQL lease this runs a whole
deployment in one process with SQLite and no Redis or Celery.

Mutual exclusion has two layers. Inside one worker, a table of claimed turns keeps two of
its threads off the same turn: lease backends let an owner acquire its own lease again
(with a new fence), so the lease alone would not separate threads that share the
worker's owner token. Across workers and processes, the lease decides. The fence is the
last line of defence: a worker that paused past its TTL (a long GC pause, a frozen VM)
and wakes up still believing it holds the lease has its saves refused by the store once
the new holder has saved.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from agent_runner._runtime import pickup
from agent_runner.errors import AgentRunnerError, log_failure
from agent_runner.ids import new_id
from agent_runner.in_memory import InMemoryTurnLease
from agent_runner.leasing import HeldLease, LeaseKeeper, TurnHolder
from agent_runner.periodic import DEADLINE_SWEEP, PeriodicSweep, SweepThread, deadline_sweep
from agent_runner.persistence import AgentTurnStore, DeadlineSource, TurnLease
from agent_runner.results import Delivery, DeliveryOutcome, StopReason
from agent_runner.runner import AgentRunner
from agent_runner.snapshot import AgentTurn, AgentTurnStatus

logger = logging.getLogger("agent_runner.worker")

_MAX_BACKOFF_S = 30.0
"""Longest pause before a turn whose step raised is tried again by the same worker."""

_FOREGROUND_WAIT_S = 0.05
"""How often a foreground run waiting for a lease held elsewhere looks again."""

_DISPATCHED_TURNS = 1_000
"""Most dispatched turn ids a worker keeps for its threads, per kind (under way, new); older ones are left to the poll."""

_shared_leases: weakref.WeakKeyDictionary[AgentTurnStore, InMemoryTurnLease] = weakref.WeakKeyDictionary()
_shared_leases_lock = threading.Lock()


def _in_process_lease(turn_store: AgentTurnStore) -> TurnLease:
    """The in-process lease shared by every default-leased worker of `turn_store`.

    Two workers built without `lease=` on the same store would otherwise each have a lease
    of their own, and nothing would stop them from stepping one turn at the same time.
    """
    with _shared_leases_lock:
        try:
            lease = _shared_leases.get(turn_store)
            if lease is None:
                lease = _shared_leases[turn_store] = InMemoryTurnLease()
        except TypeError:  # a store that cannot be weakly referenced or hashed
            return InMemoryTurnLease()
        return lease


def _is_new(status: AgentTurnStatus, steps: int, parent_turn_id: str | None) -> bool:
    """Whether a turn is a root turn that has not started: work that waits behind turns under way."""
    return status is AgentTurnStatus.READY and steps == 0 and parent_turn_id is None


@dataclass
class _Claim:
    """A turn one of this worker's threads is working on."""

    turn_id: str
    thread: int
    """Identity of the thread that claimed it (the only one allowed to re-enter it)."""
    held: HeldLease | None = None
    """None while the lease is being asked for."""


class AgentWorker:
    """Advances runnable turns of `runner`'s store under per-turn leases.

    `run_once` makes one pass in the calling thread; `start` runs passes on `concurrency`
    background threads until `stop`. Either way each turn is stepped only by the holder of
    its lease, until it blocks, ends, or used `max_steps_per_claim` steps.

    Args:
        runner: The runner whose store, agents and policy are used. If it has no dispatcher,
            the worker becomes its dispatcher: turns started, resumed with `submit_resume`,
            child turns and parents whose children ended wake the worker's threads. If it
            has no `lease_scope`, the worker provides it, so `run`, `resume` and
            `run_until_blocked` in other threads step a turn only under its lease too.
        lease: Per-turn mutual exclusion shared by every worker on the store (default: an
            in-process lease shared by the workers of this process on the same store;
            workers in several processes need a shared one such as `store.SqlTurnLease`).
        concurrency: Number of threads stepping turns.
        lease_ttl: Seconds a lease lasts without renewal; a dead worker's turns are picked up
            by others after this long. Renewed every `lease_ttl / 3` while a turn is held.
        poll_interval: Seconds between polls of the store by each thread. Dispatched turns do
            not wait for a poll; a poll that found work is followed by another at once.
        max_steps_per_claim: Steps one turn may take under one lease before the worker lets
            other turns go first.
        batch_size: Runnable turns fetched per poll.
        owner: The lease owner token; unique per worker (default: host, pid and a random part).
        deadline_interval: Seconds between deadline sweeps: DEADLINE_APPROACHING reminders,
            and the `on_timeout` defaults of approvals and forms whose deadline passed.
            Several workers may sweep the same store: each reminder and default is applied
            once. None turns the sweep off (something else sweeps, such as Celery beat); so
            does a turn store that cannot list deadlines (not a `DeadlineSource`). Ignored
            when `sweeps` is given.
        sweeps: The periodic sweeps this worker runs (default: the deadline sweep every
            `deadline_interval`). Each runs at `start` and then once per its interval, on a
            thread beside the stepping threads; `run_once` runs them all on every call.

    Raises:
        ValueError: A count or duration is not positive.
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
        deadline_interval: float | None = 10.0,
        sweeps: Sequence[PeriodicSweep] | None = None,
    ) -> None:
        if concurrency < 1 or max_steps_per_claim < 1 or batch_size < 1:
            raise ValueError(
                "concurrency, max_steps_per_claim and batch_size must be at least 1, got "
                f"{concurrency}, {max_steps_per_claim} and {batch_size}"
            )
        if lease_ttl <= 0 or poll_interval <= 0:
            raise ValueError(f"lease_ttl and poll_interval must be positive, got {lease_ttl} and {poll_interval}")
        if deadline_interval is not None and deadline_interval <= 0:
            raise ValueError(f"deadline_interval must be positive or None, got {deadline_interval}")
        self.runner = runner
        self.lease: TurnLease = lease if lease is not None else _in_process_lease(runner.turn_store)
        self.concurrency = concurrency
        self.lease_ttl_ms = max(1, int(lease_ttl * 1000))
        self.poll_interval = poll_interval
        self.max_steps_per_claim = max_steps_per_claim
        self.batch_size = batch_size
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{new_id()[:8]}"
        if sweeps is None:
            sweeps = ()
            if deadline_interval is not None and isinstance(runner.turn_store, DeadlineSource):
                sweeps = (deadline_sweep(runner, deadline_interval),)
        self.sweeps = SweepThread(sweeps)
        if runner.dispatcher is None:
            runner.dispatcher = self
        if runner.lease_scope is None:
            runner.lease_scope = self.hold
        self.keeper = LeaseKeeper(self.lease, self.lease_ttl_ms, name=f"worker {self.owner}")
        self._lock = threading.Lock()
        self._claims: dict[str, _Claim] = {}
        self._backoff: dict[str, tuple[float, float]] = {}
        # Turns handed over by `dispatch`, oldest first (ordered sets), for the threads to try
        # before they poll: `_continuing` holds turns under way, `_dispatched` new ones, taken
        # after. Losing one costs latency only: the poll finds every runnable turn.
        # Each maps a turn id to the version it was dispatched at, and when (see `_advance`).
        self._continuing: OrderedDict[str, pickup.Sighting] = OrderedDict()
        self._dispatched: OrderedDict[str, pickup.Sighting] = OrderedDict()
        self._wake = threading.Event()
        self._next_poll = 0.0  # time.monotonic() at which a thread of this worker polls the store next
        self._stop: threading.Event | None = None
        self._threads: list[threading.Thread] = []

    @property
    def deadline_interval(self) -> float | None:
        """Seconds between the deadline sweeps of this worker; None when it runs none."""
        return self.sweeps.intervals.get(DEADLINE_SWEEP)

    # --- Dispatcher ---------------------------------------------------------------------------

    def dispatch(self, turn: AgentTurn) -> None:
        """Hand a runnable turn to the stepping threads: the next thread to wake tries it first.

        The thread goes to the turn directly instead of polling the store for it, a turn under
        way before any turn that has not started. A turn that is not runnable yet (a retry
        that is not due, a delayed start that has not come) is left to the poll, which finds
        it when it is due; so are turns beyond the last `_DISPATCHED_TURNS` dispatched of
        their kind.
        """
        if turn.is_runnable(self.runner.clock()):
            seen = pickup.seen_now(turn.version)
            self._enqueue(turn.id, seen, ahead=not _is_new(turn.status, turn.steps, turn.parent_turn_id))
        self._wake.set()

    def _enqueue(self, turn_id: str, seen: pickup.Sighting, *, ahead: bool = False) -> None:
        """Queue `turn_id`, `seen` at a version, for the threads: `ahead` of the new turns (a turn under way), or behind them."""
        with self._lock:
            waiting = self._continuing if ahead else self._dispatched
            waiting[turn_id] = seen
            if len(waiting) > _DISPATCHED_TURNS:
                waiting.popitem(last=False)

    def _next_dispatched(self) -> tuple[str, pickup.Sighting] | None:
        """Take the oldest dispatched turn under way, else the oldest new one, with its version; None when none waits."""
        with self._lock:
            for waiting in (self._continuing, self._dispatched):
                if waiting:
                    return waiting.popitem(last=False)
        return None

    # --- Running ------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """Whether background threads started by `start` are still alive."""
        return any(thread.is_alive() for thread in self._threads)

    def run_once(self) -> int:
        """Make one pass in this thread over the runnable turns; return the steps made.

        The pass starts with the worker's sweeps (the deadline sweep by default), so a
        turn resumed by its deadline's default is stepped in the same pass. Then each
        runnable turn this worker can lease is stepped until it blocks, ends, or used
        `max_steps_per_claim` steps: first the turns dispatched to it, then those the store
        lists. Turns whose lease is held elsewhere are skipped. Turns that become runnable
        during the pass (child turns, a parent whose last child ended) are left to the next
        pass.

        Raises:
            StoreError: The store could not list the runnable turns or the due deadlines.
        """
        self.sweeps.run_all()
        seen: set[str] = set()
        steps = self._run_dispatched(None, seen)
        return steps + self._run_polled(None, seen)

    def start(self) -> None:
        """Start the stepping threads (a no-op while they run)."""
        with self._lock:
            if self._stop is not None and not self._stop.is_set() and self.is_running:
                return
            # Each start gets its own stop event: threads left running by a `stop` that timed
            # out keep theirs set and finish, instead of being revived by this start.
            stop = threading.Event()
            self._stop = stop
            self._next_poll = 0.0
            self._threads = [t for t in self._threads if t.is_alive()]
            for index in range(self.concurrency):
                thread = threading.Thread(target=self._loop, args=(stop,), name=f"agent-worker-{index}", daemon=True)
                thread.start()
                self._threads.append(thread)
            self.sweeps.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the stepping threads; return whether they all ended within `timeout` seconds.

        The sweeps' thread stops too (a sweep being run is waited for within `timeout`).
        A step in flight (a model or tool call) is not interrupted: its thread ends after it,
        and its lease keeps being renewed until then, so no other worker takes the turn over
        while it runs. A thread still busy after `timeout` goes on to the end of its step.
        """
        with self._lock:
            stop = self._stop
            threads = list(self._threads)
        if stop is not None:
            stop.set()
        self._wake.set()
        deadline = time.monotonic() + max(0.0, timeout)
        sweeps_stopped = self.sweeps.stop(timeout)
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in threads if t.is_alive()]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
        if not alive and not self.keeper.held:
            # Nothing is held any more: let the heartbeat thread end now rather than a beat later.
            self.keeper.stop(max(0.0, min(1.0, deadline - time.monotonic())))
        return not alive and sweeps_stopped

    def __enter__(self) -> AgentWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            # Clear before looking, not after: a dispatch that arrives during the pass then
            # makes the wait below return at once instead of being forgotten.
            self._wake.clear()
            seen: set[str] = set()
            try:
                steps = self._run_dispatched(stop, seen)
                # Dispatched turns do not wait for the poll, and a wake-up does not poll
                # either: polling is the safety net, once per interval for the whole worker
                # (one thread of hundreds polls, not each), or again at once after a poll
                # that found work (more may wait beyond one batch).
                if self._take_poll():
                    polled = self._run_polled(stop, seen)
                    steps += polled
                    if polled:
                        self._poll_again()
            except Exception as exc:
                log_failure(
                    logger,
                    exc,
                    "worker %s: polling the store failed; trying again in %ss",
                    self.owner,
                    self.poll_interval,
                )
                steps = 0
            if steps == 0 and not stop.is_set():
                self._wake.wait(max(0.0, self._next_poll - time.monotonic()))

    def _take_poll(self) -> bool:
        """Whether this thread polls the store now; if so, the next poll of the worker is an interval away."""
        with self._lock:
            now = time.monotonic()
            if now < self._next_poll:
                return False
            self._next_poll = now + self.poll_interval
            return True

    def _poll_again(self) -> None:
        with self._lock:
            self._next_poll = 0.0

    def _run_dispatched(self, stop: threading.Event | None, seen: set[str]) -> int:
        """Advance as many dispatched turns as were waiting at this call, under way first; add them to `seen`.

        A turn dispatched under way during the pass goes ahead of the new turns still waiting.
        """
        with self._lock:
            waiting = len(self._continuing) + len(self._dispatched)
        steps = 0
        for _ in range(waiting):
            if stop is not None and stop.is_set():
                break
            taken = self._next_dispatched()
            if taken is None:
                break
            turn_id, sighting = taken
            if turn_id in seen or self._is_backing_off(turn_id):
                continue  # a turn backing off is found again by the poll once it may run
            seen.add(turn_id)
            steps += self._try_advance(turn_id, sighting, stop)
        return steps

    def _run_polled(self, stop: threading.Event | None, seen: set[str]) -> int:
        """Advance the runnable turns the store lists, except those in `seen` or dispatched meanwhile."""
        now = self.runner.clock()
        with self._lock:
            # Turns backing off after a failure stay at the head of the list (it is ordered by
            # last save, which a failed step does not change): fetch that many more, or a few
            # broken turns would hide every other runnable turn from this worker. The same
            # goes for the turns this pass skips.
            ticks = time.monotonic()
            self._backoff = {k: v for k, v in self._backoff.items() if v[0] > ticks}
            extra = len(self._backoff) + len(seen) + len(self._continuing) + len(self._dispatched)
        refs = self.runner.turn_store.list_runnable(now, self.batch_size + extra)
        # Turns under way first (a stable sort keeps the store's order within each kind). A
        # READY turn has not taken a step: every step leaves a turn in another status.
        refs.sort(key=lambda ref: ref.status is AgentTurnStatus.READY)
        steps = 0
        for ref in refs:
            if stop is not None and stop.is_set():
                break
            if ref.turn_id in seen or self._is_backing_off(ref.turn_id) or self._is_dispatched(ref.turn_id):
                # Tried in this pass already, backing off, or dispatched during the pass (the
                # next pass takes those first).
                continue
            seen.add(ref.turn_id)
            # A flagged cancel keeps the version: a turn polled with one is loaded, not taken from the cache.
            sighting = None if ref.cancel_requested else pickup.seen_now(ref.version)
            steps += self._try_advance(ref.turn_id, sighting, stop)
        return steps

    def _try_advance(self, turn_id: str, seen: pickup.Sighting | None, stop: threading.Event | None) -> int:
        try:
            return self._advance(turn_id, seen, stop)
        except Exception as exc:
            # One broken turn (an unknown agent, a store error) must not stop the others.
            log_failure(logger, exc, "worker %s: advancing turn %s failed; trying it again later", self.owner, turn_id)
            self._back_off(turn_id)
            return 0

    def _is_dispatched(self, turn_id: str) -> bool:
        with self._lock:
            return turn_id in self._continuing or turn_id in self._dispatched

    def _advance(self, turn_id: str, seen: pickup.Sighting | None, stop: threading.Event | None) -> int:
        """Step one turn, `seen` at a version, under its lease until it blocks, ends, or used its share of steps."""

        def may_step(held: HeldLease) -> bool:
            return (stop is None or not stop.is_set()) and self.keeper.may_step(held)

        holder = TurnHolder(self._held, may_step, max_steps=self.max_steps_per_claim, then=self._after_delivery)
        result = self.runner.deliver(turn_id, holder, seen=seen).result
        return 0 if result is None else result.steps

    def _after_delivery(self, delivery: Delivery) -> None:
        """Once the lease is released: back off from a turn whose step raised, or queue one whose share ran out."""
        result = delivery.result
        if delivery.outcome is DeliveryOutcome.NOT_FOUND or delivery.outcome is DeliveryOutcome.LEASE_HELD:
            return
        if result is not None and result.stopped is StopReason.FAILED:
            self._back_off(delivery.turn_id)
            return
        self._clear_backoff(delivery.turn_id)
        if result is not None and result.stopped is StopReason.BUDGET:
            # Its share is used up, not its work: queue it behind every turn dispatched
            # meanwhile, new ones included (that is what the share is for), rather than
            # leave it to the next poll.
            self._enqueue(delivery.turn_id, pickup.seen_now(result.turn.version))

    # --- Leases -------------------------------------------------------------------------------

    @contextmanager
    def hold(self, turn_id: str) -> Iterator[HeldLease | None]:
        """Hold the turn's lease for the `with` block, renewed by the heartbeat; the runner's `lease_scope`.

        Waits while another holder steps the turn. Yields the lease, or None once the turn
        is no longer runnable (the other holder ran it until it blocked or ended). The
        thread that holds the lease may enter `hold` again for the same turn.

        Raises:
            StoreError: The lease backend or the store failed (the caller is told rather than
                left waiting for a backend that is down).
        """
        with self._lock:
            existing = self._claims.get(turn_id)
        if existing is not None and existing.thread == threading.get_ident() and existing.held is not None:
            # Re-entered by the holding thread: the outer `with` releases the lease.
            yield existing.held
            return
        while True:
            with self._claim(turn_id, quiet=False) as claim:
                if claim is not None and claim.held is not None:
                    yield claim.held
                    return
            if not self.runner.turn_store.get_ref(turn_id).is_runnable(self.runner.clock()):
                yield None
                return
            time.sleep(min(self.poll_interval, _FOREGROUND_WAIT_S))

    @contextmanager
    def _held(self, turn_id: str) -> Iterator[HeldLease | None]:
        """The turn's lease for a delivery, once this worker has claimed the turn (None: taken here or elsewhere)."""
        with self._claim(turn_id) as claim:
            yield None if claim is None else claim.held

    @contextmanager
    def _claim(self, turn_id: str, *, quiet: bool = True) -> Iterator[_Claim | None]:
        """Claim the turn in this worker and take its lease; yield None when either is taken.

        With `quiet`, a lease backend error is logged and treated as "taken" (the poll comes
        back to the turn later); otherwise it is raised.
        """
        with self._lock:
            claimed_here = turn_id in self._claims
            if not claimed_here:
                claim = self._claims[turn_id] = _Claim(turn_id, threading.get_ident())
        if claimed_here:
            yield None  # another thread of this worker has it
            return
        try:
            try:
                held = self.keeper.acquire(turn_id, self.owner)
            except AgentRunnerError as exc:
                if not quiet:
                    raise
                logger.warning("worker %s: could not ask for the lease of turn %s: %s", self.owner, turn_id, exc)
                held = None
            if held is None:
                yield None
                return
            with self._lock:
                claim.held = held
            try:
                yield claim
            finally:
                # Forget the claim before releasing: once released, another worker may take the turn.
                with self._lock:
                    self._claims.pop(turn_id, None)
                self.keeper.release(held)
        finally:
            with self._lock:
                if self._claims.get(turn_id) is claim:
                    del self._claims[turn_id]

    # --- Failures -----------------------------------------------------------------------------

    def _back_off(self, turn_id: str) -> None:
        with self._lock:
            delay = self._backoff.get(turn_id, (0.0, self.poll_interval))[1]
            delay = min(delay * 2, _MAX_BACKOFF_S)
            self._backoff[turn_id] = (time.monotonic() + delay, delay)

    def _clear_backoff(self, turn_id: str) -> None:
        with self._lock:
            self._backoff.pop(turn_id, None)

    def _is_backing_off(self, turn_id: str) -> bool:
        with self._lock:
            entry = self._backoff.get(turn_id)
        return entry is not None and entry[0] > time.monotonic()
