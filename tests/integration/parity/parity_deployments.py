"""The two execution paths the parity tests compare, behind one interface.

- `EmbeddedDeployment`: `AgentWorker` processes (`embedded_worker_main`) on a PostgreSQL
  store with the SQL lease; no Redis, no broker.
- `CeleryDeployment`: `celery -A workers.app worker` processes on PostgreSQL and Redis
  (lease, guard, broker), from the Celery tests' `Cluster`.

Each has the producer side a web app would have: a runner in the test process over the same
store that starts, resumes and cancels turns and never steps one (the embedded one has no
dispatcher and the workers poll; the Celery one enqueues `step_turn` messages). Workers are
processes of their own, started and stopped by pid, with the same lease TTL, two stepping
threads or pool processes each, and the agents and step recorder of `parity_agents`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from agent_runner import AgentRunner, AgentTurn, ChatMemoryProvider
from store import SqlAgentTurnStore, SqlChatMemoryProvider
from tests.integration.celery_workers.celery_cluster import Cluster, clusters
from tests.integration.embedded_worker.embedded_fleet import WorkerProcess, spawn_worker
from tests.integration.parity.parity_agents import LOADER, SETUP, SIGNALS_VARIABLE, Signals, build_loader
from tests.integration.parity.parity_history import SavedHistory, read_history
from workers.sweeps import sweep_stale_turns

LEASE_TTL_S = 2.0
"""The lease TTL of every worker of both paths."""
CONCURRENCY = 2
"""Stepping threads of an embedded worker, pool processes of a Celery worker."""

T = TypeVar("T")


class Worker(Protocol):
    """A worker process a deployment started: its process group id is its pid."""

    @property
    def pid(self) -> int: ...

    def stop(self) -> object: ...


class Deployment(ABC):
    """One execution path (see the module docstring).

    Attributes:
        kind: `"embedded"` or `"celery"`.
        signals: The folder the tools, the step recorder and the test share.
        turn_store: The store every process uses.
        memories: The ChatMemory of conversations, in the same database.
        runner: The producer-side runner: starts, resumes and cancels turns, never steps one.
    """

    kind: str

    def __init__(
        self, signals: Signals, turn_store: SqlAgentTurnStore, memories: ChatMemoryProvider, runner: AgentRunner
    ) -> None:
        self.signals = signals
        self.turn_store = turn_store
        self.memories = memories
        self.runner = runner
        self.workers: list[Worker] = []

    @abstractmethod
    def start_workers(self, *names: str) -> list[Worker]:
        """Start a worker process per name, all at once, and wait until each takes work.

        They are stopped by `stop_workers`, or when the deployment ends.
        """

    @abstractmethod
    def hand_over_stale_turn(self) -> None:
        """Do what this path does to get a turn whose worker went silent to a live worker."""

    @abstractmethod
    def logs(self) -> str:
        """The output of every worker process, for failure messages."""

    def stop_workers(self) -> None:
        """Stop every worker as an operator would (SIGTERM: each finishes its step in flight) and wait for it."""
        for worker in self.workers:
            worker.stop()

    def load(self, turn_id: str) -> AgentTurn:
        return self.turn_store.load(turn_id)

    def wait_for(self, probe: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll `probe` until it returns something truthy; fail the test with the workers' logs after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not (value := probe()):
            if time.monotonic() > deadline:
                pytest.fail(f"{self.kind}: timed out after {timeout}s waiting for {what}\n{self.logs()}")
            time.sleep(0.05)
        return value

    def wait_for_turn(self, turn_id: str, condition: Callable[[AgentTurn], bool], what: str) -> AgentTurn:
        """The turn's snapshot once `condition` holds for it."""

        def probe() -> AgentTurn | None:
            turn = self.load(turn_id)
            return turn if condition(turn) else None

        return self.wait_for(probe, 30, what)

    def history(self, root_turn_id: str) -> SavedHistory:
        """The saved history of a turn tree (stop the workers first, so that nothing changes it any more)."""
        return read_history(self.turn_store, self.memories, self.signals, root_turn_id)


class EmbeddedDeployment(Deployment):
    """`AgentWorker` processes polling a PostgreSQL store, leasing turns with the SQL lease."""

    kind = "embedded"

    def __init__(self, database_url: str, folder: Path, signals: Signals) -> None:
        turn_store = SqlAgentTurnStore(database_url)
        memories = SqlChatMemoryProvider(turn_store.engine)
        runner = AgentRunner(turn_store=turn_store, agent_loader=build_loader(), chat_memory_provider=memories)
        super().__init__(signals, turn_store, memories, runner)
        self.database_url = database_url
        self.folder = folder
        self._processes: list[WorkerProcess] = []

    def start_workers(self, *names: str) -> list[Worker]:
        started = [
            spawn_worker(
                self.folder,
                name,
                self.database_url,
                lease="sql",
                lease_ttl=LEASE_TTL_S,
                concurrency=CONCURRENCY,
                agents=LOADER,
                setup=SETUP,
                env={SIGNALS_VARIABLE: str(self.signals.folder)},
            )
            for name in names
        ]
        self.workers += started
        self._processes += started
        for worker in started:
            worker.wait_ready()
        return list(started)

    def hand_over_stale_turn(self) -> None:
        """Nothing to do: workers poll the store for RUNNING turns and take one over once its lease expired."""

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} (pid {p.pid})\n{p.log()[-6000:]}" for p in self._processes)

    def close(self) -> None:
        self.stop_workers()
        self.turn_store.close()


class CeleryDeployment(Deployment):
    """`celery -A workers.app worker` processes on PostgreSQL and Redis."""

    kind = "celery"

    def __init__(self, cluster: Cluster, signals: Signals) -> None:
        self.cluster = cluster
        memories = SqlChatMemoryProvider(cluster.wiring.engine)
        super().__init__(signals, cluster.turn_store, memories, cluster.wiring.runner)

    def start_workers(self, *names: str) -> list[Worker]:
        started = [self.cluster.start_worker(name, concurrency=CONCURRENCY, wait=False) for name in names]
        self.workers += started
        self.cluster.wait_ready(*started)
        return list(started)

    def hand_over_stale_turn(self) -> None:
        """Run the stale-turn sweep (beat's job) until it re-sent a turn whose lease expired."""
        self.wait_for(lambda: sweep_stale_turns(self.cluster.wiring) > 0, 30, "the sweep to re-send the stale turn")

    def logs(self) -> str:
        return self.cluster.logs()


@contextmanager
def embedded_deployment(database_url: str, folder: Path) -> Iterator[EmbeddedDeployment]:
    """An embedded deployment on the migrated database `database_url`; its workers are stopped afterwards."""
    signals = _signals(folder)
    deployment = EmbeddedDeployment(database_url, folder, signals)
    try:
        yield deployment
    finally:
        signals.open_every_gate()
        deployment.close()


@contextmanager
def celery_deployment(database_url: str, redis_url: str, folder: Path) -> Iterator[CeleryDeployment]:
    """A Celery deployment on `database_url` and a Redis namespace of its own; its workers are stopped afterwards."""
    signals = _signals(folder)
    with clusters(database_url, redis_url, folder) as make:
        cluster = make(
            AGENT_RUNNER_AGENT_LOADER=LOADER,
            AGENT_RUNNER_SETUP=SETUP,
            AGENT_RUNNER_LEASE_TTL_S=str(LEASE_TTL_S),
            **{SIGNALS_VARIABLE: str(signals.folder)},
        )
        try:
            yield CeleryDeployment(cluster, signals)
        finally:
            signals.open_every_gate()


def _signals(folder: Path) -> Signals:
    signals = Signals(folder / "signals")
    signals.folder.mkdir(parents=True, exist_ok=True)
    return signals
