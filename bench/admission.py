"""Fair admission of new turns: a light tenant's latency while a heavy tenant floods a Celery fleet.

A fleet of two worker processes (threads pool) runs one-call turns whose model answers in
MODEL_LATENCY_S. Runs, each on a fresh queue and key prefix:

- *idle*: the light tenant starts LIGHT turns on an idle fleet, one after the other's end
  would be too kind, so at once; their latency (creation to completion) is the baseline.
- *heavy alone*: the heavy tenant starts N turns at once; its throughput is the baseline.
- *flood, admission off* and *flood, admission on*: the heavy tenant starts N turns at
  once, and once they are all queued the light tenant starts LIGHT. Reported: the light
  tenant's latencies (goal: p50 <= 2x idle with admission) and the heavy tenant's
  throughput (goal: about the same as alone, since admission gives an idle tenant's share
  to the others).

Run: `python bench/admission.py [--quick] [--json PATH]`.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _common import arguments, delete_redis_prefix, log, pg_schema, redis_url, write_results
from celery_bench import Worker, worker_env

from agent_runner import Agent, AiMessage, ChatRequest, ChatResponse, InMemoryAgentLoader

SECTION_TITLE = "## 12. Fair admission: a light tenant beside a heavy tenant's flood"
"""The heading of this section in docs/benchmarks.md."""
MODEL_LATENCY_S = 0.2
WORKER_THREADS = 8
WORKERS = 2
LIGHT = 20
RUN_TIMEOUT_S = 600.0
START_TIMEOUT_S = 60.0
AGENT = "bench-admission"


class SleepingModel:
    """Answers after MODEL_LATENCY_S, holding the worker thread as a real call does (calls overlap: no lock)."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        time.sleep(MODEL_LATENCY_S)
        return ChatResponse(message=AiMessage(content="ok"))


def build_loader() -> InMemoryAgentLoader:
    """The agent of this benchmark, for the worker processes (`AGENT_RUNNER_AGENT_LOADER=admission:build_loader`)."""
    return InMemoryAgentLoader([Agent(id=AGENT, chat_model=SleepingModel())])


class Fleet:
    """Two workers and a producer on one queue and key prefix, with or without admission."""

    def __init__(self, database_url: str, window: int | None) -> None:
        from workers.celery_app.config import create_app
        from workers.settings import WorkerSettings
        from workers.wiring import build_wiring

        self.prefix = f"bench-admission-{uuid.uuid4().hex[:8]}"
        env = worker_env(database_url, self.prefix, f"{self.prefix}-queue")
        env["AGENT_RUNNER_AGENT_LOADER"] = "admission:build_loader"
        if window is not None:
            env["AGENT_RUNNER_ADMISSION_WINDOW"] = str(window)
        settings = WorkerSettings.from_env(env)
        self.wiring = build_wiring(settings, create_app(settings), agent_loader=build_loader(), tasks_in_flight=8)
        folder = Path(tempfile.mkdtemp(prefix="bench-admission-"))
        self.workers = [
            Worker("workers.app", env, WORKER_THREADS, folder / f"w{n}.log", pool="threads") for n in range(WORKERS)
        ]
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(self.wiring.celery_app.control.ping(timeout=0.5) or []) < WORKERS:
            for worker in self.workers:
                worker.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {START_TIMEOUT_S} s")
        # Every worker thread builds its connections on its first turn: warm them all up.
        self.wait(self.start(WORKERS * WORKER_THREADS * 2, None))

    def start(self, count: int, tenant: str | None) -> list[str]:
        """Start `count` turns of `tenant` at once (from 8 threads, faster than the fleet drains them)."""

        def one(n: int) -> str:
            return str(self.wiring.runner.start(AGENT, f"question {n}", tenant_id=tenant).id)

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(count)))

    def wait(self, turn_ids: list[str]) -> dict[str, tuple[float, float]]:
        """Wait until every turn completed; return turn id -> (created, completed) in seconds since the epoch."""
        turns = sa.table("agent_turns", sa.column("id"), sa.column("status"), sa.column("created_at"))
        turns.append_column(sa.column("updated_at"))
        wanted = set(turn_ids)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            query = sa.select(turns.c.id, turns.c.created_at, turns.c.updated_at).where(turns.c.status == "COMPLETED")
            with self.wiring.engine.connect() as connection:
                done = {
                    str(turn_id): (created.timestamp(), updated.timestamp())
                    for turn_id, created, updated in connection.execute(query)
                    if turn_id in wanted
                }
            if len(done) == len(wanted):
                return done
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(wanted) - len(done)} turns still open after {RUN_TIMEOUT_S} s")
            for worker in self.workers:
                worker.check()
            time.sleep(0.1)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.wiring.close()
        delete_redis_prefix(redis_url(), self.prefix)


def _latencies(times: dict[str, tuple[float, float]]) -> list[float]:
    return sorted(completed - created for created, completed in times.values())


def _throughput(times: dict[str, tuple[float, float]]) -> float:
    first = min(created for created, _ in times.values())
    last = max(completed for _, completed in times.values())
    return len(times) / (last - first)


def _percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(fraction * len(values)))]


def run(database_url: str, heavy: int, window: int | None, light_after_s: float | None) -> dict[str, Any]:
    """One run: `heavy` turns of the heavy tenant (if any), then LIGHT of the light tenant after `light_after_s`."""
    fleet = Fleet(database_url, window)
    try:
        heavy_ids = fleet.start(heavy, "heavy") if heavy else []
        result: dict[str, Any] = {"window": window, "heavy": heavy}
        if light_after_s is not None:
            time.sleep(light_after_s)
            light_ids = fleet.start(LIGHT, "light")
            light = _latencies(fleet.wait(light_ids))
            result["light_p50_s"] = statistics.median(light)
            result["light_p95_s"] = _percentile(light, 0.95)
        if heavy_ids:
            result["heavy_turns_per_s"] = _throughput(fleet.wait(heavy_ids))
        return result
    finally:
        fleet.close()


def goals(data: dict[str, Any] | None) -> list[tuple[str, str, str, bool | None]]:
    """The goals of this section (name, target, measured, met), for the report."""
    runs = {run["name"]: run for run in (data or {}).get("runs", [])}
    idle, alone, fair = runs.get("idle"), runs.get("heavy alone"), runs.get("flood, admission on")
    latency = None if idle is None or fair is None else fair["light_p50_s"] / idle["light_p50_s"]
    share = None if alone is None or fair is None else fair["heavy_turns_per_s"] / alone["heavy_turns_per_s"]
    return [
        (
            "Fair admission: a light tenant's p50 latency beside a flood, against an idle fleet",
            "<= 2x",
            "not measured" if latency is None else f"{latency:.2f}x",
            None if latency is None else latency <= 2.0,
        ),
        (
            "Fair admission: the flooding tenant's throughput, against the same tenant alone",
            ">= 0.9x",
            "not measured" if share is None else f"{share:.2f}x",
            None if share is None else share >= 0.9,
        ),
    ]


def section(results: dict[str, Any]) -> str:
    """This section of docs/benchmarks.md."""
    slots = WORKERS * WORKER_THREADS
    lines = [
        f"A Celery fleet of {WORKERS} worker processes (threads pool, {WORKER_THREADS} threads each: {slots} "
        f"slots; PostgreSQL store, Redis broker) runs one-call turns whose model answers in {MODEL_LATENCY_S:g} s. "
        f"The heavy tenant starts {results['heavy']} turns at once (from 8 producer threads); "
        f"{results['light_after_s']:g} s later the light tenant starts {LIGHT}. Latency is a turn's creation to "
        "its completion; throughput is the heavy tenant's turns over the time from its first creation to its "
        "last completion. *Idle*: the light tenant's turns alone. *Heavy alone*: the flood without the light "
        "tenant. `bench/admission.py`.",
        "",
        "| run | admission window | light p50 | light p95 | heavy turns/s |",
        "|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        window = "off" if run["window"] is None else str(run["window"])
        p50 = f"{run['light_p50_s']:.2f} s" if "light_p50_s" in run else "-"
        p95 = f"{run['light_p95_s']:.2f} s" if "light_p95_s" in run else "-"
        rate = f"{run['heavy_turns_per_s']:.1f}" if "heavy_turns_per_s" in run else "-"
        lines.append(f"| {run['name']} | {window} | {p50} | {p95} | {rate} |")
    return "\n".join(lines)


def main() -> None:
    args = arguments(__doc__)
    heavy = 1000 if args.quick else 5000
    slots = WORKERS * WORKER_THREADS
    window = slots // 2  # what docs/workers.md suggests: about half the fleet's slots
    light_after_s = 1.0
    plan: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
        ("idle", lambda url: run(url, 0, window, 0.0)),
        ("heavy alone", lambda url: run(url, heavy, window, None)),
        ("flood, admission off", lambda url: run(url, heavy, None, light_after_s)),
        ("flood, admission on", lambda url: run(url, heavy, window, light_after_s)),
    ]
    # Larger windows: more of the flood sits in the broker ahead of a newcomer.
    for larger in (slots, 2 * slots):
        plan.append((f"flood, admission on (window {larger})", lambda url, w=larger: run(url, heavy, w, light_after_s)))
    results: dict[str, Any] = {"heavy": heavy, "light_after_s": light_after_s, "runs": []}
    with pg_schema("bench_admission") as (database_url, _schema):
        for name, measure in plan:
            log(f"admission: {name}")
            outcome = {"name": name, **measure(database_url)}
            log(f"  {outcome}")
            results["runs"].append(outcome)
    write_results(args.json, results)
    print(section(results))


if __name__ == "__main__":
    main()
