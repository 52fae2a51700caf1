"""How many turns one worker process holds at once, and the connection pools that takes.

A step of a turn spends nearly all its time waiting: for the model (hundreds of
milliseconds to many seconds) or for a tool. A worker process therefore holds as many
turns at once as it has tasks in flight, not as it has CPUs. Celery's thread pool runs
hundreds of waiting tasks in one process; the prefork pool runs one per child process.
The shipped configuration is `--pool threads --concurrency 1000`.

Threads share the process's database pool and Redis clients. A thread holds a database
connection only while its statements run (milliseconds per step), never while the model
answers, so a few dozen connections serve a thousand threads. The Redis clients open a
connection for each thread that calls at the same moment and keep it (redis-py's pools
grow on demand), so they need no sizing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.settings import WorkerSettings

SHIPPED_POOL = "threads"
"""The Celery pool the deploy files run: many tasks per process, for steps that wait on models."""
SHIPPED_CONCURRENCY = 1000
"""Tasks in flight per worker process in the deploy files (threads of the pool)."""

THREADS_PER_CONNECTION = 50
"""Threads the default database pool plans one kept-open connection for."""
MAX_THREADS_PER_CONNECTION = 100
"""Beyond this many threads per connection (kept plus overflow), steps queue for the database."""

_SINGLE_TASK_POOLS = frozenset({"prefork", "processes", "solo"})
"""Pools whose every process runs one task at a time."""


@dataclass(frozen=True)
class PoolSize:
    """Size of a SQLAlchemy connection pool: `size` connections kept open, `overflow` more opened on demand."""

    size: int
    overflow: int

    @property
    def connections(self) -> int:
        """Most connections the pool opens at once."""
        return self.size + self.overflow


DEFAULT_POOL = PoolSize(5, 10)
"""The pool of a process that runs one task at a time (prefork children, web apps, the CLI)."""


def database_pool(settings: WorkerSettings, threads: int) -> PoolSize:
    """The database pool of a process whose `threads` tasks use the database at once.

    `AGENT_RUNNER_DB_POOL_SIZE` and `AGENT_RUNNER_DB_MAX_OVERFLOW` win when set; otherwise
    one kept-open connection per `THREADS_PER_CONNECTION` threads, from 5 up to 20, and 10
    on demand. Capped at 20 because PostgreSQL's own limit (`max_connections`, 100 by
    default) is shared by every process of the deployment.
    """
    size = settings.db_pool_size
    if size is None:
        size = max(DEFAULT_POOL.size, min(math.ceil(threads / THREADS_PER_CONNECTION), 20))
    overflow = settings.db_max_overflow if settings.db_max_overflow is not None else DEFAULT_POOL.overflow
    return PoolSize(size, overflow)


def server_database_pool(settings: WorkerSettings, worker_threads: int = 0) -> PoolSize:
    """The database pool of an HTTP server process: `DEFAULT_POOL`'s most connections, all kept open.

    A request of the server uses the database for most of its time, so under load the
    server's request threads use as many connections as it has requests in flight. The
    overflow connections of `DEFAULT_POOL` would then be opened and closed again for
    nearly every request (a new PostgreSQL backend each time); keeping them open costs no
    more connections at the peak. A server that also steps turns (`worker_threads`, the
    embedded worker's threads) keeps open what `database_pool` plans for those threads
    too, and never more than one per thread. `AGENT_RUNNER_DB_POOL_SIZE` and `AGENT_RUNNER_DB_MAX_OVERFLOW` win when set.
    """
    size = settings.db_pool_size
    if size is None:
        # Each thread holds at most one connection at a time.
        size = DEFAULT_POOL.connections + min(worker_threads, database_pool(settings, worker_threads).size)
    overflow = settings.db_max_overflow if settings.db_max_overflow is not None else 0
    return PoolSize(size, overflow)


def pool_name(pool_cls: Any) -> str:
    """The name Celery's `--pool` option gives `pool_cls` (a name, or the pool class once resolved)."""
    if isinstance(pool_cls, str):
        return pool_cls.rsplit(":", 1)[0].rsplit(".", 1)[-1]
    module = str(getattr(pool_cls, "__module__", ""))
    name = module.rsplit(".", 1)[-1]
    return "threads" if name == "thread" else name


def tasks_per_process(pool: str, concurrency: int) -> int:
    """Tasks one process of a worker with `pool` and `concurrency` runs at once (and so database users)."""
    return 1 if pool in _SINGLE_TASK_POOLS else concurrency


def capacity_warnings(settings: WorkerSettings, pool: str, concurrency: int) -> list[str]:
    """What keeps a worker with `pool` and `concurrency` from holding many waiting turns; empty when nothing does."""
    warnings: list[str] = []
    if pool in _SINGLE_TASK_POOLS and concurrency < 100:
        warnings.append(
            f"the {pool} pool with concurrency {concurrency} holds {concurrency} turn(s) at once: every turn "
            f"waiting on its model keeps a process busy; for model calls that wait, run "
            f"--pool {SHIPPED_POOL} --concurrency {SHIPPED_CONCURRENCY}"
        )
    elif pool in ("gevent", "eventlet"):
        warnings.append(
            f"the {pool} pool runs greenlets, but the database and Redis clients here block the whole "
            f"process: use --pool {SHIPPED_POOL}"
        )
    threads = tasks_per_process(pool, concurrency)
    database = database_pool(settings, threads)
    if threads > database.connections * MAX_THREADS_PER_CONNECTION:
        warnings.append(
            f"{threads} tasks share {database.connections} database connections "
            f"(AGENT_RUNNER_DB_POOL_SIZE={database.size}, AGENT_RUNNER_DB_MAX_OVERFLOW={database.overflow}): "
            f"steps will queue for a connection; allow at least one per {MAX_THREADS_PER_CONNECTION} tasks"
        )
    return warnings
