"""Worker capacity: the shipped pool holds many waiting turns, and the database pool follows the concurrency."""

from __future__ import annotations

from pathlib import Path

import yaml

import store
from workers.capacity import (
    DEFAULT_POOL,
    SHIPPED_CONCURRENCY,
    SHIPPED_POOL,
    PoolSize,
    capacity_warnings,
    database_pool,
    pool_name,
    server_database_pool,
    tasks_per_process,
)
from workers.settings import WorkerSettings

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def _worker_command_options(command: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in command if arg.startswith("--") and "=" in arg)


def test_the_deploy_files_run_the_shipped_pool_and_concurrency() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    k8s = yaml.safe_load((DEPLOY / "k8s" / "worker-deployment.yaml").read_text())
    commands = [compose["services"]["worker"]["command"], k8s["spec"]["template"]["spec"]["containers"][0]["command"]]
    for command in commands:
        options = _worker_command_options(command)
        assert options["pool"] == SHIPPED_POOL
        assert int(options["concurrency"]) == SHIPPED_CONCURRENCY


def test_the_database_pool_grows_with_the_threads_of_a_process_up_to_a_cap() -> None:
    settings = WorkerSettings.from_env({})
    # Given one task per process (prefork children, web apps): the old default.
    assert database_pool(settings, 1) == DEFAULT_POOL
    # When a process runs hundreds of threads: more kept-open connections, but bounded,
    # since PostgreSQL's connection limit is shared by the whole deployment.
    assert database_pool(settings, 500) == PoolSize(10, 10)
    assert database_pool(settings, SHIPPED_CONCURRENCY) == PoolSize(20, 10)
    assert database_pool(settings, 100_000) == PoolSize(20, 10)


def test_the_database_pool_size_can_be_fixed_in_the_environment() -> None:
    settings = WorkerSettings.from_env({"AGENT_RUNNER_DB_POOL_SIZE": "7", "AGENT_RUNNER_DB_MAX_OVERFLOW": "0"})
    assert database_pool(settings, SHIPPED_CONCURRENCY) == PoolSize(7, 0)


def test_an_http_server_keeps_open_as_many_connections_as_it_may_open() -> None:
    # Its requests use the database most of their time: overflow connections would be
    # opened and closed for nearly every request under load.
    pool = server_database_pool(WorkerSettings.from_env({}))
    assert pool == PoolSize(DEFAULT_POOL.connections, 0)
    fixed = WorkerSettings.from_env({"AGENT_RUNNER_DB_POOL_SIZE": "7", "AGENT_RUNNER_DB_MAX_OVERFLOW": "2"})
    assert server_database_pool(fixed) == PoolSize(7, 2)


def test_a_server_that_also_steps_turns_keeps_connections_for_its_worker_threads_too() -> None:
    settings = WorkerSettings.from_env({})
    # The embedded worker's threads get what a worker process of that many threads plans, one per thread at most
    assert server_database_pool(settings, 2) == PoolSize(DEFAULT_POOL.connections + 2, 0)
    assert server_database_pool(settings, 8) == PoolSize(DEFAULT_POOL.connections + DEFAULT_POOL.size, 0)
    assert server_database_pool(settings, 1000) == PoolSize(DEFAULT_POOL.connections + 20, 0)
    fixed = WorkerSettings.from_env({"AGENT_RUNNER_DB_POOL_SIZE": "7"})
    assert server_database_pool(fixed, 1000) == PoolSize(7, 0)


def test_make_engine_opens_a_postgresql_pool_of_the_size_asked_for() -> None:
    engine = store.make_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test", pool_size=20, max_overflow=3)
    try:
        assert engine.pool.size() == 20  # type: ignore[attr-defined]
        assert engine.pool._max_overflow == 3  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_pool_names_are_read_from_option_values_and_resolved_classes() -> None:
    from celery.concurrency import prefork, solo, thread

    assert pool_name("threads") == "threads"
    assert pool_name("celery.concurrency.thread:TaskPool") == "thread"
    assert pool_name(thread.TaskPool) == "threads"
    assert pool_name(prefork.TaskPool) == "prefork"
    assert pool_name(solo.TaskPool) == "solo"
    assert tasks_per_process("prefork", 4) == 1
    assert tasks_per_process("threads", 1000) == 1000


def test_the_shipped_configuration_starts_without_warnings() -> None:
    assert capacity_warnings(WorkerSettings.from_env({}), SHIPPED_POOL, SHIPPED_CONCURRENCY) == []


def test_a_prefork_worker_is_told_it_holds_few_turns() -> None:
    (warning,) = capacity_warnings(WorkerSettings.from_env({}), "prefork", 4)
    assert "holds 4 turn(s) at once" in warning
    assert f"--pool {SHIPPED_POOL} --concurrency {SHIPPED_CONCURRENCY}" in warning


def test_a_green_pool_is_refused_in_words() -> None:
    (warning,) = capacity_warnings(WorkerSettings.from_env({}), "gevent", 1000)
    assert "use --pool threads" in warning


def test_a_database_pool_too_small_for_the_threads_is_reported() -> None:
    settings = WorkerSettings.from_env({"AGENT_RUNNER_DB_POOL_SIZE": "2", "AGENT_RUNNER_DB_MAX_OVERFLOW": "1"})
    # 3 connections serve up to 300 threads; 1000 would queue for them.
    assert capacity_warnings(settings, "threads", 300) == []
    (warning,) = capacity_warnings(settings, "threads", 1000)
    assert "1000 tasks share 3 database connections" in warning
    assert "AGENT_RUNNER_DB_POOL_SIZE=2" in warning


def test_the_embedded_worker_command_holds_many_turns_by_default(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from workers.cli import main

    url = f"sqlite:///{tmp_path / 'agents.db'}"
    result = CliRunner().invoke(
        main, ["--database-url", url, "worker", "--run-for", "0"], env={"CELERY_BROKER_URL": ""}, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "stepping turns with 64 thread(s)" in result.output
