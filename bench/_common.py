"""Shared pieces of the benchmarks: workload W, services, statistics, byte counters, machine facts.

Workload W: one turn = K tool calls, one per response of a scripted model (no network),
then a final answer, so a turn takes 2K + 1 steps (K=10 -> 21). The model looks only at
the last message, so its own cost does not grow with history: whatever grows is the
runner's (or the peer's).

This module stays light (no matplotlib, no LangGraph): Celery worker processes import it
as their agent loader (`AGENT_RUNNER_AGENT_LOADER=_common:build_loader`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from agent_runner import (
    Agent,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"


def database_url() -> str:
    """The PostgreSQL server the benchmarks use (each run works in a schema of its own)."""
    return os.environ.get("AGENT_RUNNER_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)


def redis_url() -> str:
    """The Redis database the benchmarks use (keys under a per-run prefix, deleted afterwards)."""
    return os.environ.get("AGENT_RUNNER_BENCH_REDIS_URL", DEFAULT_REDIS_URL)


# --- Workload W -----------------------------------------------------------------------------------

_call_numbers = itertools.count()


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


@tool(requires_approval=True)
def refund(order_id: str) -> str:
    """Refund an order (needs a person's approval)."""
    return f"order {order_id}: refunded"


def calls_done(last: Any) -> int:
    """How many tool calls of this turn are answered, read from the last message alone (O(1))."""
    if isinstance(last, ToolMessage) and last.tool_call_id.startswith("w"):
        return int(last.tool_call_id[1:].split("x", 1)[0]) + 1
    return 0


class WorkloadModel:
    """Scripted model of W: K tool calls, one per response, then a final answer.

    A plain `ChatModel` rather than `ScriptedChatModel`, which records every request (a
    test aid that would grow without bound over thousands of turns).
    """

    def __init__(self, k: int) -> None:
        self.k = k

    def generate(self, request: ChatRequest) -> ChatResponse:
        done = calls_done(request.messages[-1])
        if done >= self.k:
            return ChatResponse(message=AiMessage(content="all orders shipped"))
        # Call ids are unique across turns, so a conversation's memory never holds two alike.
        call = ToolCall(id=f"w{done}x{next(_call_numbers)}", name="lookup", arguments={"order_id": str(done)})
        return ChatResponse(message=AiMessage(tool_calls=[call]))


class ApprovalModel:
    """Asks for one `refund` (which needs approval), then answers once its result is in."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        last = request.messages[-1]
        if isinstance(last, ToolMessage):
            return ChatResponse(message=AiMessage(content="refund done"))
        call = ToolCall(id=f"r{next(_call_numbers)}", name="refund", arguments={"order_id": "1001"})
        return ChatResponse(message=AiMessage(tool_calls=[call]))


def w_agent(k: int, *, window: int = 50) -> Agent:
    """The agent of W(K): id `w<K>`, or `w<K>-h<window>` for another history window."""
    agent_id = f"w{k}" if window == 50 else f"w{k}-h{window}"
    return Agent(
        id=agent_id,
        chat_model=WorkloadModel(k),
        tools=[lookup],
        max_iterations=k + 1,
        max_attached_messages=window,
    )


def approval_agent() -> Agent:
    """One approval-gated tool call, then a final answer: the resume-latency workload."""
    return Agent(id="approval", chat_model=ApprovalModel(), tools=[refund], max_iterations=4)


WORKLOAD_KS = (1, 10, 50, 200)


def build_loader() -> InMemoryAgentLoader:
    """Every benchmark agent, for worker processes (`AGENT_RUNNER_AGENT_LOADER=_common:build_loader`)."""
    agents = [w_agent(k) for k in WORKLOAD_KS]
    agents += [w_agent(10, window=500), approval_agent()]
    return InMemoryAgentLoader(agents)


def steps_per_turn(k: int) -> int:
    return 2 * k + 1


def prior_messages(n: int, tag: str = "") -> list[UserMessage | AiMessage]:
    """`n` earlier messages of a conversation: questions and plain answers, about 60 bytes each."""
    return [
        UserMessage(id=f"p{tag}-{i}", content=f"earlier question {i} about order {1000 + i}")
        if i % 2 == 0
        else AiMessage(id=f"p{tag}-{i}", content=f"earlier answer {i}: it shipped on monday")
        for i in range(n)
    ]


# --- Statistics -----------------------------------------------------------------------------------


@dataclass
class Stat:
    """Median of repetitions, with their min and max."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            raise ValueError("no values")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), linear between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99, min and max of latencies, in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "min": min(ms),
        "max": max(ms),
        "n": len(ms),
    }


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# --- PostgreSQL -----------------------------------------------------------------------------------


def libpq(url: str) -> str:
    """The URL as psycopg and libpq spell it (no SQLAlchemy driver suffix)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def pg_schema(prefix: str = "bench", *, migrate: bool = True) -> Iterator[tuple[str, str]]:
    """A new PostgreSQL schema `<prefix>_<pid>_<random>`, migrated; yields (SQLAlchemy URL, schema); dropped after."""
    import psycopg
    from sqlalchemy.engine import make_url

    base = database_url()
    schema = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(libpq(base), autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    try:
        if migrate:
            import store

            store.migrate(url)
        yield url, schema
    finally:
        with psycopg.connect(libpq(base), autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def wal_position(connection: Any) -> int:
    """The server's WAL insert position in bytes (server-wide: other activity adds to it)."""
    row = connection.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()
    return int(row[0])


class DriverBytes:
    """Counts the statements an engine's connections run on the driver, and the bytes of their parameters.

    It watches psycopg's cursors rather than SQLAlchemy's statement events: a listener on
    those would make the store run its per-step statements through SQLAlchemy (where
    listeners see them) instead of on the driver, and so change what is measured. Only
    connections the engine's pool opens or hands out after this counter was made are counted.
    """

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        self.statements = 0
        self.bytes = 0
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        # Pool events, not statement events: they leave the store's driver path alone.
        event.listen(engine, "connect", lambda dbapi_connection, _record: self._connections.add(dbapi_connection))
        event.listen(engine, "checkout", lambda dbapi_connection, *_: self._connections.add(dbapi_connection))
        _COUNTERS.add(self)
        _watch_psycopg()

    def _on_statement(self, cursor: Any, parameters: Any, many: bool) -> None:
        if cursor.connection not in self._connections:
            return
        self.statements += 1
        for values in parameters if many else [parameters]:
            self.bytes += _parameter_bytes(values)

    def take(self) -> tuple[int, int]:
        """(statements, parameter bytes) since the last call."""
        taken = (self.statements, self.bytes)
        self.statements = self.bytes = 0
        return taken


_COUNTERS: weakref.WeakSet[DriverBytes] = weakref.WeakSet()


def _watch_psycopg() -> None:
    """Wrap psycopg's `Cursor.execute` and `executemany` once, to report to every live `DriverBytes`."""
    import psycopg

    if getattr(psycopg.Cursor, "_bench_watched", False):
        return
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def watched_execute(self: Any, query: Any, params: Any = None, **options: Any) -> Any:
        for counter in list(_COUNTERS):
            counter._on_statement(self, params, False)
        return execute(self, query, params, **options)

    def watched_executemany(self: Any, query: Any, params_seq: Any, **options: Any) -> Any:
        params_seq = list(params_seq)
        for counter in list(_COUNTERS):
            counter._on_statement(self, params_seq, True)
        return executemany(self, query, params_seq, **options)

    psycopg.Cursor.execute = watched_execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = watched_executemany  # type: ignore[method-assign]
    psycopg.Cursor._bench_watched = True  # type: ignore[attr-defined]


def _parameter_bytes(values: Any) -> int:
    """About the bytes of a statement's parameters as sent: text as UTF-8, JSON as its text."""
    if values is None:
        return 0
    items = values.values() if isinstance(values, dict) else values
    total = 0
    for value in items:
        wrapped = getattr(value, "obj", None)  # psycopg's Json wrapper, as SQLAlchemy passes JSON
        if wrapped is not None:
            value = json.dumps(wrapped, ensure_ascii=False, separators=(",", ":"), default=str)
        if value is None:
            continue
        if isinstance(value, bytes | bytearray):
            total += len(value)
        elif isinstance(value, str):
            total += len(value.encode())
        elif isinstance(value, list | tuple):
            total += _parameter_bytes(value)
        else:
            total += len(str(value))
    return total


# --- Redis ----------------------------------------------------------------------------------------


def delete_redis_prefix(url: str, prefix: str) -> int:
    """Delete every key under `prefix` in the Redis database of `url`; return how many."""
    from redis import Redis

    client: Any = Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        return len(keys)
    finally:
        client.close()


# --- Machine facts --------------------------------------------------------------------------------

PACKAGES = (
    "agent-runner",
    "pydantic",
    "SQLAlchemy",
    "psycopg",
    "celery",
    "kombu",
    "redis",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-postgres",
    "langchain-core",
    "matplotlib",
    "psutil",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict[str, Any]:
    """Cores, CPU, memory, OS, Python, package versions, PostgreSQL and Redis versions and settings."""
    import psutil

    facts: dict[str, Any] = {
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "cpu_model": _cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "packages": {},
    }
    for name in PACKAGES:
        try:
            facts["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            facts["packages"][name] = "not installed"
    try:
        import psycopg

        with psycopg.connect(libpq(database_url()), autocommit=True) as connection:
            facts["postgresql"] = connection.execute("SHOW server_version").fetchone()[0]
            facts["postgresql_settings"] = {
                name: connection.execute(f"SHOW {name}").fetchone()[0]
                for name in ("fsync", "synchronous_commit", "wal_level", "shared_buffers")
            }
    except Exception as exc:  # reported, not fatal: the sections needing it will fail on their own
        facts["postgresql"] = f"unreachable ({type(exc).__name__})"
    try:
        from redis import Redis

        client: Any = Redis.from_url(redis_url())
        info = client.info("server")
        facts["redis"] = info.get("redis_version")
        client.close()
    except Exception as exc:
        facts["redis"] = f"unreachable ({type(exc).__name__})"
    return facts


# --- Command line ---------------------------------------------------------------------------------


def arguments(
    description: str | None, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """`--quick` (a smoke run with less work per repetition) and `--json PATH` (where to write results)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run with fewer turns per repetition")
    parser.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def write_results(path: Path | None, results: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1, default=str))


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def stop_process_group(process: subprocess.Popen[Any]) -> None:
    """SIGTERM a process started in a session of its own (with its children), SIGKILL if it is not gone in 20 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


class TickerModel:
    """A chat model that streams `deltas` deltas, `interval` seconds apart, then answers "done".

    The turn's input is JSON: `{"deltas": N, "interval": seconds}`. Each delta is the wall-clock
    time (`time.time()`) at which it was handed to the runner, so a follower can tell how long
    it took to arrive.
    """

    def generate(self, request: ChatRequest) -> ChatResponse:
        opening = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
        spec = json.loads(opening.content)
        for _ in range(int(spec["deltas"])):
            time.sleep(float(spec["interval"]))
            if request.on_delta is not None:
                request.on_delta(f"{time.time():.6f}")
        return ChatResponse(message=AiMessage(content="done"))
