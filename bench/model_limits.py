"""Shared model limits: a Celery fleet of two workers against a provider that allows R requests per W seconds.

N turns start at once against a local fake provider (the OpenAI chat-completions wire
format, the real `openai` adapter pointed at it) that answers 429 with Retry-After past R
requests in any W seconds. The fleet runs twice, alternately: without limits (every worker
finds the limit on its own, through 429s and its retry policy) and with
`AGENT_RUNNER_MODEL_LIMITS` set to the provider's rate (`rpm` = R * 60 / W). Reported: turns
failed, requests sent against requests needed (one per turn), and the drain time against
the least the limit allows ((N - R) / R * W: a full window at once, then R per window).

Limiter CPU: the limiter alone (acquire and settle of one call), and one-call turns of a
scripted model in this process (in-memory store) with no limiter, the in-process one and the
Redis one (limits high enough that every call is granted), in interleaved blocks; the
difference in process CPU per turn is what the limiter adds to a call.

Run: `python bench/model_limits.py [--quick] [--json PATH]`.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _common import ROOT, arguments, delete_redis_prefix, log, pg_schema, redis_url, write_results
from celery_bench import Worker, worker_env

# The fake provider and the agent on it are the ones the tests use (the workers find them on
# the PYTHONPATH that `worker_env` sets).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tests.helpers.fake_openai import FakeChatServer, ProviderLimit, RecordedRequest, Reply, completion
from tests.helpers.limited_agents import LIMIT_KEY, PROVIDER_URL_VARIABLE

SECTION_TITLE = "## 11. Shared model limits: a fleet against one provider limit"
"""The heading of this section in docs/benchmarks.md."""
MODEL_LATENCY_S = 0.2
RUN_TIMEOUT_S = 600.0
WORKER_THREADS = 50
START_TIMEOUT_S = 60.0


def fleet_run(database_url: str, turns: int, limit: ProviderLimit, limited: bool) -> dict[str, Any]:
    """Start `turns` at once on two workers against a fresh fake provider; return what happened."""
    from workers.settings import WorkerSettings
    from workers.wiring import build_wiring

    assert limit.requests is not None
    server = FakeChatServer(lambda request: _answer(request), limit)
    prefix = f"bench-limits-{uuid.uuid4().hex[:8]}"
    env = worker_env(database_url, prefix, f"{prefix}-queue")
    env["AGENT_RUNNER_AGENT_LOADER"] = "tests.helpers.limited_agents:build_loader"
    env[PROVIDER_URL_VARIABLE] = server.base_url
    if limited:
        env["AGENT_RUNNER_MODEL_LIMITS"] = json.dumps({LIMIT_KEY: {"rpm": round(limit.requests * 60 / limit.window_s)}})
    os.environ[PROVIDER_URL_VARIABLE] = server.base_url  # the producer loads the same agents
    from workers.celery_app.config import create_app

    settings = WorkerSettings.from_env(env)
    wiring = build_wiring(settings, create_app(settings))
    folder = Path(tempfile.mkdtemp(prefix="bench-limits-"))
    workers = [Worker("workers.app", env, WORKER_THREADS, folder / f"w{n}.log", pool="threads") for n in range(2)]
    try:
        _wait_ready(wiring.celery_app, workers)
        started = time.monotonic()
        for n in range(turns):
            wiring.runner.start("limited", f"question {n}", tenant_id=("acme", "globex")[n % 2])
        counts = _wait_all_ended(wiring.engine, turns, workers)
        drained = time.monotonic() - started
    finally:
        for worker in workers:
            worker.stop()
        wiring.close()
        server.close()
        delete_redis_prefix(redis_url(), prefix)
    with wiring.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM agent_turns"))
    sent = server.counts.accepted + server.counts.refused
    return {
        "limited": limited,
        "turns": turns,
        "completed": counts.get("COMPLETED", 0),
        "failed": counts.get("FAILED", 0),
        "requests_sent": sent,
        "requests_refused": server.counts.refused,
        "requests_needed": turns,
        "drain_s": drained,
        "minimum_drain_s": (turns - limit.requests) / limit.requests * limit.window_s,
        "spread_drain_s": (turns - 1) * limit.window_s / limit.requests,
    }


def _answer(request: RecordedRequest) -> Reply:
    return Reply(body=completion("ok", usage=(20, 1)), delay=MODEL_LATENCY_S)


def _wait_ready(app: Any, workers: list[Worker]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(app.control.ping(timeout=0.5) or []) < len(workers):
        for worker in workers:
            worker.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready after {START_TIMEOUT_S} s")


def _wait_all_ended(engine: sa.Engine, turns: int, workers: list[Worker]) -> dict[str, int]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    query = sa.text("SELECT status, count(*) FROM agent_turns GROUP BY status")
    while True:
        with engine.connect() as connection:
            counts = {str(status): int(count) for status, count in connection.execute(query)}
        ended = counts.get("COMPLETED", 0) + counts.get("FAILED", 0) + counts.get("CANCELLED", 0)
        if ended >= turns:
            return counts
        if time.monotonic() > deadline:
            raise RuntimeError(f"turns still open after {RUN_TIMEOUT_S} s: {counts}")
        for worker in workers:
            worker.check()
        time.sleep(0.2)


def limiter_cpu(block: int, repetitions: int) -> dict[str, Any]:
    """CPU per model call: the limiter alone (acquire and settle), and one-call turns with and without it.

    Blocks of `block` calls alternate between the configurations, `repetitions` times; the
    medians of the per-block figures (and of the per-block differences) are reported, so the
    other work of a shared machine weighs on every configuration alike.
    """
    from agent_runner import Agent, AgentRunner, AiMessage, InProcessModelLimiter, ModelLimit, ScriptedChatModel
    from store import RedisModelLimiter

    key = "bench:model"
    generous = {key: ModelLimit(rpm=10**9, tpm=10**12, concurrency=10**6)}
    prefix = f"bench-limiter-{uuid.uuid4().hex[:8]}"
    redis_limiter = RedisModelLimiter(generous, redis_url(), prefix=prefix)
    limiters: dict[str, Any] = {"none": None, "in-process": InProcessModelLimiter(generous), "redis": redis_limiter}
    agent = Agent(id="bench", chat_model=ScriptedChatModel(lambda request: AiMessage("ok"), rate_limit_key=key))
    turn_cpu: dict[str, list[float]] = {name: [] for name in limiters}
    alone_cpu: dict[str, list[float]] = {"in-process": [], "redis": []}
    try:
        for repetition in range(repetitions):
            for name, limiter in limiters.items():
                runner = AgentRunner(model_limiter=limiter)
                runner.run(agent, "warm up")
                started = time.process_time()
                for _ in range(block):
                    runner.run(agent, "hi")
                turn_cpu[name].append((time.process_time() - started) / block * 1000)
                if limiter is not None:
                    started = time.process_time()
                    for n in range(block):
                        grant = limiter.acquire(key, 100, f"r{repetition}-{n}")
                        limiter.settle(grant, 50)
                    alone_cpu[name].append((time.process_time() - started) / block * 1000)
    finally:
        redis_limiter.close()
        delete_redis_prefix(redis_url(), prefix)
    return {
        "calls_per_block": block,
        "repetitions": repetitions,
        "turn_cpu_ms": {name: statistics.median(values) for name, values in turn_cpu.items()},
        "extra_cpu_ms": {
            name: statistics.median(a - b for a, b in zip(turn_cpu[name], turn_cpu["none"], strict=True))
            for name in ("in-process", "redis")
        },
        "alone_cpu_ms": {name: statistics.median(values) for name, values in alone_cpu.items()},
    }


def goals(data: dict[str, Any] | None) -> list[tuple[str, str, str, bool | None]]:
    """The goals of this section (name, target, measured, met), from its run with limits, for the report."""
    limited = next((run for run in (data or {}).get("runs", []) if run["limited"]), None)
    extra = (data or {}).get("cpu", {}).get("extra_cpu_ms", {}).get("redis")
    where = (
        "a fleet, N turns at once against R requests / W s"
        if data is None
        else (
            f"a fleet, {data['turns']} turns at once against {data['limit']['requests']} requests / "
            f"{data['limit']['window_s']:g} s"
        )
    )
    ratio = None if limited is None else limited["requests_sent"] / limited["requests_needed"]
    return [
        (
            f"Shared model limits, {where}: turns failed",
            "0",
            "not measured" if limited is None else str(limited["failed"]),
            None if limited is None else limited["failed"] == 0,
        ),
        (
            f"Shared model limits, {where}: requests sent / needed",
            "<= 1.05x",
            "not measured" if ratio is None else f"{ratio:.2f}x",
            None if ratio is None else ratio <= 1.05,
        ),
        (
            "Redis model limiter: CPU added to a model call",
            "<= 0.3 ms",
            "not measured" if extra is None else f"{extra:.3f} ms",
            None if extra is None else extra <= 0.3,
        ),
    ]


def section(results: dict[str, Any]) -> str:
    """This section of docs/benchmarks.md."""
    limit = results["limit"]
    lines = [
        f"A Celery fleet of two worker processes (threads pool, {WORKER_THREADS} threads each, PostgreSQL store, "
        f"Redis broker) starts {results['turns']} turns at once against a local fake provider that allows "
        f"{limit['requests']} requests per {limit['window_s']:g} s (sliding window; 429 with Retry-After past it) "
        f"and answers in {MODEL_LATENCY_S:g} s; the real `openai` adapter is pointed at it. Each turn is one model "
        "call. *Without limits* is today's behaviour: each worker finds the limit through 429s and its retry policy "
        "(3 attempts). *With limits*: `AGENT_RUNNER_MODEL_LIMITS` set to the provider's rate. *Least drain*: a "
        "full window at once, then the rate; *spread drain*: one request every W / R seconds from the start, which "
        "is what the limiter aims for. `bench/model_limits.py`.",
        "",
        "| run | turns failed | requests sent / needed | 429 answers | drain | least drain | spread drain |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        name = "with limits" if run["limited"] else "without limits"
        lines.append(
            f"| {name} | {run['failed']} of {run['turns']} | {run['requests_sent']} / {run['requests_needed']} "
            f"({run['requests_sent'] / run['requests_needed']:.2f}x) | {run['requests_refused']} | "
            f"{run['drain_s']:.1f} s | {run['minimum_drain_s']:.1f} s | {run['spread_drain_s']:.1f} s |"
        )
    cpu = results["cpu"]
    lines += [
        "",
        f"Limiter CPU per model call (goal <= 0.3 ms), in blocks of {cpu['calls_per_block']} calls, "
        f"{cpu['repetitions']} interleaved repetitions, medians:",
        "",
        "| limiter | acquire + settle alone | one-call turn (scripted model, in-memory store) | added to the turn |",
        "|---|---|---|---|",
        f"| none | - | {cpu['turn_cpu_ms']['none']:.3f} ms | - |",
    ]
    for name in ("in-process", "redis"):
        lines.append(
            f"| {name} | {cpu['alone_cpu_ms'][name]:.3f} ms | {cpu['turn_cpu_ms'][name]:.3f} ms "
            f"| {cpu['extra_cpu_ms'][name]:.3f} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    args = arguments(__doc__)
    turns, limit = (60, ProviderLimit(requests=12, window_s=2.0)) if args.quick else (300, ProviderLimit(60, 10.0))
    results: dict[str, Any] = {"turns": turns, "limit": {"requests": limit.requests, "window_s": limit.window_s}}
    with pg_schema("bench_limits") as (database_url, _schema):
        runs = []
        for limited in (False, True):
            log(f"model limits: {turns} turns, {'with' if limited else 'without'} limits")
            runs.append(fleet_run(database_url, turns, limit, limited))
            log(f"  {runs[-1]}")
        results["runs"] = runs
    results["cpu"] = limiter_cpu(200, 5 if args.quick else 15)
    log(f"  limiter CPU: {results['cpu']}")
    write_results(args.json, results)
    print(section(results))


if __name__ == "__main__":
    main()
