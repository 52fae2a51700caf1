"""A Celery deployment for the event tests, and follower processes that read its events.

The deployment is the one of `tests.integration.celery_workers.celery_cluster` (real
`celery worker` processes on PostgreSQL and Redis), with the streaming agents of
`tests.integration.celery_events.event_agents`, in a PostgreSQL schema and under a Redis
key prefix of its own. Followers run `tests.integration.celery_events.event_follower` in
child processes and are stopped by their pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from redis import Redis
from redis.exceptions import RedisError

import store
from agent_runner import AgentEvent
from tests.conftest import TEST_REDIS_URL, libpq_url
from tests.helpers.processes import REPO_ROOT, with_tests_importable
from tests.integration.celery_events import event_agents, event_follower
from tests.integration.celery_workers import celery_agents
from tests.integration.celery_workers.celery_cluster import Cluster, cluster_env, delete_prefix

FOLLOWER_STOP_TIMEOUT_S = 10.0


@contextmanager
def event_cluster(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """A deployment in a new migrated schema with the ledger tables; every process it started is stopped after."""
    _check_redis(TEST_REDIS_URL)
    schema = f"ev_{uuid.uuid4().hex[:12]}"
    namespace = f"ar-ev-{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq_url(postgres_url), autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    url = sa.make_url(postgres_url).update_query_dict({"options": f"-csearch_path={schema}"})
    schema_url = url.render_as_string(hide_password=False)
    cluster: Cluster | None = None
    try:
        store.migrate(schema_url)
        engine = sa.create_engine(schema_url)
        try:
            celery_agents.metadata.create_all(engine)
            event_agents.metadata.create_all(engine)
        finally:
            engine.dispose()
        env = cluster_env(
            schema_url=schema_url,
            redis_url=TEST_REDIS_URL,
            namespace=namespace,
            AGENT_RUNNER_AGENT_LOADER=f"{event_agents.__name__}:build_loader",
            AGENT_RUNNER_INBOX_AGENT=event_agents.AGENT_ID,
        )
        cluster = Cluster(env=env, tmp_path=tmp_path, redis_url=TEST_REDIS_URL)
        yield cluster
    finally:
        try:
            if cluster is not None:
                try:
                    cluster.stop_all()
                finally:
                    cluster.close()
        finally:
            celery_agents.dispose_ledger_engine()
            delete_prefix(TEST_REDIS_URL, namespace)
            with psycopg.connect(libpq_url(postgres_url), autocommit=True) as admin:
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _check_redis(url: str) -> None:
    client: Redis[Any] = Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except RedisError as exc:
        pytest.fail(f"Redis at {url} is unreachable: {exc}")
    finally:
        client.close()


# --- Followers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One event as a follower received it."""

    event: AgentEvent
    received_at: float


@dataclass
class Follower:
    """A follower process, and the JSON lines it writes."""

    name: str
    process: subprocess.Popen[bytes]
    out: Path
    log: Path

    def received(self) -> list[Received]:
        """The events written so far; a partial last line (the process was killed mid-write) is left out."""
        if not self.out.exists():
            return []
        lines = self.out.read_text(encoding="utf-8").split("\n")[:-1]
        records = [json.loads(line) for line in lines]
        return [Received(AgentEvent.model_validate(r["event"]), float(r["received_at"])) for r in records]

    def events(self) -> list[AgentEvent]:
        return [r.event for r in self.received()]

    def finish(self, timeout: float) -> list[AgentEvent]:
        """Wait for the follower to stop on its own (after the root turns ended); return its events."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"follower {self.name} still running after {timeout}s:\n{self.output()}")
        assert code == 0, f"follower {self.name} exited with {code}:\n{self.output()}"
        return self.events()

    def kill(self) -> None:
        """SIGKILL the follower (a client that vanishes without a word)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(FOLLOWER_STOP_TIMEOUT_S)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


def start_follower(
    cluster: Cluster, name: str, conversation_id: str, *, after: str | None = None, roots: int = 1
) -> Follower:
    """Follow `conversation_id` from `after` in a new process until `roots` root turns ended."""
    out = cluster.tmp_path / f"follower-{name}.jsonl"
    log = cluster.tmp_path / f"follower-{name}.log"
    args = [
        sys.executable,
        "-m",
        event_follower.__name__,
        "--database-url",
        cluster.settings.database_url,
        "--redis-url",
        cluster.redis_url,
        "--prefix",
        cluster.settings.redis_prefix,
        "--conversation",
        conversation_id,
        "--out",
        str(out),
        "--roots",
        str(roots),
    ]
    if after is not None:
        args += ["--after", after]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            args, cwd=REPO_ROOT, env=with_tests_importable(os.environ), stdout=sink, stderr=subprocess.STDOUT
        )
    return Follower(name, process, out, log)


def stop_followers(followers: list[Follower]) -> None:
    for follower in followers:
        follower.kill()
