"""A per-test deployment for the Celery worker tests (used by `conftest.py` and the tests).

Its worker processes are those of `tests.helpers.celery_fleet` (the prefork pool unless a
test asks for another); the deployment adds the settings, a producer-side wiring, and
helpers to read the test agents' ledger and the test's queue.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from kombu.connection import Connection
from redis import Redis

import store
from agent_runner import AgentResumeCommand, AgentTurn, AgentTurnStatus, SuspensionType
from tests.helpers.celery_fleet import CeleryFleet
from tests.helpers.processes import with_tests_importable
from tests.integration.celery_workers import celery_agents
from tests.integration.celery_workers.celery_agents import DETAILS_FORM, LEDGER_URL_VARIABLE
from workers.celery_app.config import create_app, task_queues
from workers.celery_app.names import STEP_TURN
from workers.settings import WorkerSettings
from workers.wiring import ProcessBackends, build_wiring

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
RABBITMQ_URL = os.environ.get("AGENT_RUNNER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@dataclass(kw_only=True)
class Cluster(CeleryFleet):
    """A per-test deployment: the fleet of its worker processes, settings and a producer-side wiring."""

    redis_url: str
    settings: WorkerSettings = field(init=False)
    wiring: ProcessBackends = field(init=False)

    def __post_init__(self) -> None:
        self.settings = WorkerSettings.from_env(self.env)
        self.celery_app = create_app(self.settings)
        self.wiring = build_wiring(self.settings, self.celery_app)

    @property
    def runner(self) -> Any:
        return self.wiring.runner

    @property
    def turn_store(self) -> store.SqlAgentTurnStore:
        return self.wiring.turn_store

    # --- turns, people, ledger ---------------------------------------------------------------

    def load(self, turn_id: str) -> AgentTurn:
        return self.turn_store.load(turn_id)

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float, what: str, tick: Callable[[], None] = lambda: None
    ) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout}s waiting for {what}\n{self.logs()}")
            tick()
            time.sleep(0.05)

    def finish_elsewhere(self, turn_id: str, timeout: float) -> AgentTurn:
        """A second worker and the beat (whose due-retry sweep sends a waiting turn again) take the turn to its end."""
        self.start_worker("second", pool="threads", concurrency=2)
        self.start_beat()
        self.wait_for(lambda: self.load(turn_id).is_terminal, timeout, "the turn to end")
        return self.load(turn_id)

    def answer_people(self, turn_ids: list[str]) -> None:
        """Play the people: approve pending approvals and fill in pending forms of these turns."""
        for turn_id in turn_ids:
            turn = self.load(turn_id)
            suspension = turn.suspension
            if suspension is None or turn.is_terminal:
                continue
            call_id = suspension.correlation_id or ""
            if turn.status is AgentTurnStatus.WAITING_FOR_APPROVAL:
                command = AgentResumeCommand.approve_tool(call_id).with_metadata("approverId", "test")
            elif turn.status is AgentTurnStatus.WAITING_FOR_USER and suspension.type is SuspensionType.USER_INPUT:
                assert suspension.form is not None and suspension.form.key == DETAILS_FORM.key
                command = AgentResumeCommand.user_input(call_id, {"value": "filled"})
            else:
                continue
            self.runner.submit_resume(turn_id, command)

    def ledger(self) -> list[dict[str, Any]]:
        engine = sa.create_engine(self.settings.database_url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(sa.text("SELECT * FROM test_ledger ORDER BY effect")).mappings()
                return [dict(row) for row in rows]
        finally:
            engine.dispose()

    def attempts(self) -> dict[str, tuple[int, float]]:
        engine = sa.create_engine(self.settings.database_url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(sa.text("SELECT idempotency_key, attempts, last_at FROM test_attempts"))
                return {row[0]: (int(row[1]), float(row[2])) for row in rows}
        finally:
            engine.dispose()

    def queue_length(self) -> int:
        """Messages waiting in the test's queue (Redis broker: every priority list of the queue)."""
        prefix = self.settings.broker_key_prefix or ""
        client: Redis[Any] = Redis.from_url(self.settings.broker_url, socket_timeout=5)
        try:
            waiting = 0
            for key in client.keys(f"{prefix}{self.settings.queue}*"):
                if client.type(key) == b"list":  # type: ignore[no-untyped-call]  # untyped in types-redis
                    waiting += client.llen(key)
            return waiting
        finally:
            client.close()

    def queued_steps(self) -> Counter[tuple[Any, ...]]:
        """The `step_turn` arguments of every message waiting in the test's two queues (taken off them)."""
        found: Counter[tuple[Any, ...]] = Counter()
        with self.celery_app.connection_for_read() as connection:
            channel = connection.default_channel
            for queue in task_queues(self.settings.queue):
                queue(channel).declare()  # type: ignore[no-untyped-call]  # kombu is untyped
                while (raw := channel.basic_get(queue.name, no_ack=True)) is not None:
                    message = channel.message_to_python(raw)
                    assert message.headers["task"] == STEP_TURN, message.headers
                    args, _kwargs, _embed = message.decode()
                    found[tuple(args)] += 1
        return found

    def purge_queue(self) -> int:
        """Drop the messages waiting in the test's queues (the queue and its queue of new turns)."""
        with self.celery_app.connection_for_write() as connection:
            channel = connection.default_channel
            return sum(int(channel.queue_purge(queue.name) or 0) for queue in task_queues(self.settings.queue))

    def close(self) -> None:
        self.wiring.close()


def cluster_env(
    *, schema_url: str, redis_url: str, namespace: str, broker_url: str | None = None, **overrides: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_RUNNER_", "CELERY_"))}
    env.update(
        {
            "AGENT_RUNNER_DATABASE_URL": schema_url,
            LEDGER_URL_VARIABLE: schema_url,
            "AGENT_RUNNER_REDIS_URL": redis_url,
            "AGENT_RUNNER_REDIS_PREFIX": namespace,
            "CELERY_BROKER_URL": broker_url or redis_url,
            "AGENT_RUNNER_BROKER_KEY_PREFIX": f"{namespace}:broker:",
            "AGENT_RUNNER_QUEUE": f"{namespace}-queue",
            "AGENT_RUNNER_LEASE_TTL_S": "2",
            "AGENT_RUNNER_SWEEP_INTERVAL_S": "1",
            "AGENT_RUNNER_AGENT_LOADER": f"{celery_agents.__name__}:build_loader",
            "AGENT_RUNNER_INBOX_AGENT": "inbox-agent",
            "AGENT_RUNNER_RETRY_MAX_ATTEMPTS": "4",
            "AGENT_RUNNER_RETRY_INITIAL_BACKOFF_S": "0.2",
            "AGENT_RUNNER_RETRY_MULTIPLIER": "1.5",
            "AGENT_RUNNER_RETRY_JITTER": "0",
        }
    )
    env.update(overrides)
    return with_tests_importable(env)


@contextmanager
def clusters(schema_url: str, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """A maker of the test's clusters; on the way out every process they started is stopped, whatever happened.

    All clusters of one test share a Redis key namespace (leases, guard, broker keys) and a
    queue of their own, and the namespace's keys are deleted afterwards. The maker takes an
    optional `broker_url` and environment overrides (see `cluster_env`).
    """
    namespace = f"ar-test-{uuid.uuid4().hex[:10]}"
    made: list[Cluster] = []

    def make(broker_url: str | None = None, **overrides: str) -> Cluster:
        env = cluster_env(
            schema_url=schema_url, redis_url=redis_url, namespace=namespace, broker_url=broker_url, **overrides
        )
        cluster = Cluster(env=env, tmp_path=tmp_path, redis_url=redis_url)
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        try:
            for cluster in made:
                try:
                    cluster.stop_all()
                finally:
                    if cluster.settings.broker_url.startswith("amqp"):
                        delete_amqp_queue(cluster)
                    cluster.close()
        finally:
            delete_prefix(redis_url, namespace)


def delete_prefix(redis_url: str, prefix: str) -> None:
    client: Redis[Any] = Redis.from_url(redis_url, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()


def reachable_rabbitmq_url() -> str:
    """The test RabbitMQ's URL (`AGENT_RUNNER_TEST_AMQP_URL`); fails the test when it cannot be reached."""
    url = os.environ.get("AGENT_RUNNER_TEST_AMQP_URL", RABBITMQ_URL)
    try:
        with Connection(url, connect_timeout=3) as connection:  # type: ignore[no-untyped-call]  # kombu is untyped
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        pytest.fail(f"RabbitMQ at {url} is unreachable ({type(exc).__name__}: {exc}); start it first")
    return url


def delete_amqp_queue(cluster: Cluster) -> None:
    for queue in task_queues(cluster.settings.queue):
        try:
            with cluster.celery_app.connection_for_write() as connection:
                connection.default_channel.queue_delete(queue.name)
        except Exception as exc:  # the queue may never have been declared
            print(f"could not delete queue {queue.name}: {exc}")


class ConnectionKiller(threading.Thread):
    """Terminates, every few tens of milliseconds, the backends of `application` that are in the middle of a call.

    `pause` bounds the random wait between two rounds, in seconds.

    A backend is in a call when it is not idle: running a statement, or between the
    statements of an open transaction. With `idle_first`, the first round terminates every
    backend of `application`, idle ones too (connections waiting in the workers' pools, dead
    at their next use), so a fault lands even when the calls are too quick to be caught.
    """

    def __init__(
        self,
        admin: psycopg.Connection[Any],
        application: str,
        seed: int,
        pause: tuple[float, float] = (0.02, 0.15),
        *,
        idle_first: bool = False,
    ) -> None:
        super().__init__(name="connection-killer", daemon=True)
        self._admin = admin
        self._application = application
        self._random = random.Random(seed)
        self._pause = pause
        self._idle_first = idle_first
        self._stopping = threading.Event()
        self.killed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            busy_only = not self._idle_first
            while not self._stopping.wait(self._random.uniform(*self._pause)):
                rows = self._admin.execute(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s AND (state <> 'idle' OR NOT %s) AND pid <> pg_backend_pid()",
                    [self._application, busy_only],
                ).fetchall()
                terminated = sum(1 for _, done in rows if done)
                self.killed += terminated
                busy_only = busy_only or terminated > 0
        except BaseException as exc:  # reported by the test: a killer that died would prove nothing
            self.error = exc

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)
