"""Turns with real model latency: what one Celery worker process holds, and how fast, per pool.

Every other section uses an instant model. Here the model waits L seconds per call,
streaming ten deltas on the way, and a turn is three model calls and two tool steps (W(2):
five steps). N turns arrive at once (a burst, which is also a backlog for a small pool) or
at a steady rate. One worker process runs them, against PostgreSQL and Redis (broker,
leases, live events). For each pool configuration and L it reports:

- in-flight: most model calls waiting at once in the worker (counted by the model);
- turns/s, and the ideal: concurrency / service time, and what the worker's CPU allows
  (1 / CPU per turn), whichever is lower;
- p50/p99 turn latency (saved READY to saved COMPLETED) and time to first token (saved
  READY to the first delta), against the service time of one turn alone;
- RSS of the worker per in-flight turn (peak minus idle), and CPU per step;
- starts/s of `runner.start` through `workers.build_runner()` from 4 threads.

    python bench/latency.py [--quick] [--json PATH]
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import (
    arguments,
    delete_redis_prefix,
    latency_summary,
    libpq,
    log,
    lookup,
    pg_schema,
    redis_url,
    write_results,
)
from celery_bench import CpuMeter, Worker, worker_env

from agent_runner import (
    Agent,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    ToolCall,
    ToolMessage,
    UserMessage,
)

AGENT_ID = "latency-agent"
TOOL_CALLS = 2
STEPS_PER_TURN = 2 * TOOL_CALLS + 1
DELTAS = 10
KEY_VARIABLE = "AGENT_RUNNER_BENCH_LATENCY_KEY"
"""Redis key prefix under which the model counts calls in flight and stamps first tokens."""


class LatencyModel:
    """Waits `latency` seconds per call (the turn's input, JSON), streaming ten deltas; two tool rounds, then an answer.

    Calls in flight are counted in the process and reported to Redis by a thread of its own
    every few milliseconds (`HSET <key>:inflight <pid> <count>`), so the count costs the
    worker next to nothing per call: the CPU measured is the runner's, not the benchmark's.
    """

    REPORT_EVERY_S = 0.01

    def __init__(self) -> None:
        self._redis: Any = None
        self._lock = threading.Lock()
        self._inflight = 0
        self._reporter_pid = 0

    def _client(self) -> Any:
        with self._lock:
            if self._redis is None or self._reporter_pid != os.getpid():
                from redis import Redis

                self._redis = Redis.from_url(os.environ["AGENT_RUNNER_REDIS_URL"])
                self._reporter_pid = os.getpid()  # a forked pool process reports on its own
                threading.Thread(target=self._report, args=(self._redis,), daemon=True).start()
            return self._redis

    def _report(self, client: Any) -> None:
        key, pid, last = f"{os.environ[KEY_VARIABLE]}:inflight", os.getpid(), -1
        while True:
            count = self._inflight
            if count != last:
                client.hset(key, str(pid), count)
                last = count
            time.sleep(self.REPORT_EVERY_S)

    def _count(self, change: int) -> None:
        with self._lock:
            self._inflight += change

    def generate(self, request: ChatRequest) -> ChatResponse:
        opening = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
        spec = json.loads(opening.content)
        results = sum(1 for m in request.messages if isinstance(m, ToolMessage))
        key = os.environ[KEY_VARIABLE]
        client = self._client()
        self._count(1)
        try:
            for index in range(DELTAS):
                time.sleep(float(spec["latency"]) / DELTAS)
                if index == 0 and results == 0:
                    client.hsetnx(f"{key}:first-token", spec["label"], repr(time.time()))
                if request.on_delta is not None:
                    request.on_delta("tok ")
        finally:
            self._count(-1)
        if results < TOOL_CALLS:
            call = ToolCall(id=f"c{results}", name="lookup", arguments={"order_id": f"{spec['label']}-{results}"})
            return ChatResponse(message=AiMessage(tool_calls=[call]))
        return ChatResponse(message=AiMessage(content="done"))


def build_loader() -> InMemoryAgentLoader:
    """`AGENT_RUNNER_AGENT_LOADER=latency:build_loader` for the workers of this section."""
    return InMemoryAgentLoader([Agent(id=AGENT_ID, chat_model=LatencyModel(), tools=[lookup], max_iterations=10)])


CONFIGS: dict[str, tuple[str, int]] = {
    "threads -c1000 (shipped)": ("threads", 1000),
    "threads -c200": ("threads", 200),
    "prefork -c4 (old default)": ("prefork", 4),
}


class Watch:
    """Samples the worker's RSS (with its pool children) and the model calls in flight while a run goes on."""

    def __init__(self, worker: Worker, redis: Any, key: str) -> None:
        self.worker, self.redis, self.key = worker, redis, key
        self.peak_rss = 0
        self.peak_inflight = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        import psutil

        main = psutil.Process(self.worker.process.pid)
        return sum(p.memory_info().rss for p in [main, *main.children(recursive=True)])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, self.rss())
            counts = self.redis.hvals(f"{self.key}:inflight")
            self.peak_inflight = max(self.peak_inflight, sum(int(count) for count in counts))
            self._stop.wait(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def start_turns(runner: Any, inputs: list[str], threads: int, rate: float | None) -> tuple[list[str], float]:
    """Start one turn per input from `threads` threads (at `rate` per second if given); their ids and starts/s."""
    began = time.perf_counter()

    def start(index: int) -> str:
        if rate is not None:
            time.sleep(max(0.0, began + index / rate - time.perf_counter()))
        return str(runner.start(AGENT_ID, inputs[index]).id)

    with ThreadPoolExecutor(threads) as pool:
        ids = list(pool.map(start, range(len(inputs))))
    return ids, len(inputs) / (time.perf_counter() - began)


def wait_done(admin: Any, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        row = admin.execute(
            "SELECT count(*) FROM agent_turns WHERE id = ANY(%s) AND status NOT IN ('READY', 'RUNNING')", (ids,)
        ).fetchone()
        if row is not None and row[0] == len(ids):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ids) - (row[0] if row else 0)} turns still running after {timeout:.0f} s")
        time.sleep(0.2)
    bad = admin.execute(
        "SELECT id, status FROM agent_turns WHERE id = ANY(%s) AND status <> 'COMPLETED' LIMIT 3", (ids,)
    ).fetchall()
    if bad:
        raise RuntimeError(f"turns ended unexpectedly: {bad}")


def run_once(
    ctx: dict[str, Any], worker: Worker, label: str, latency: float, turns: int, rate: float | None
) -> dict[str, Any]:
    """N turns on a running worker; the figures of one row."""
    runner, admin, redis, key = ctx["runner"], ctx["admin"], ctx["redis"], ctx["key"]
    redis.delete(f"{key}:first-token")
    inputs = [json.dumps({"latency": latency, "label": f"{label}-{i}"}) for i in range(turns)]
    watch = Watch(worker, redis, key)
    idle_rss = watch.rss()
    meter = CpuMeter(worker)
    started = time.perf_counter()
    ids, starts_per_s = start_turns(runner, inputs, 4, rate)
    service_bound = 3 * latency * 20 + 120  # a generous bound: the slowest pool runs a turn at a time
    wait_done(admin, ids, timeout=max(service_bound, turns * 3 * latency / 2 + 120))
    elapsed = time.perf_counter() - started
    cpu = meter.read()
    watch.close()
    rows = admin.execute("SELECT id, created_at, updated_at FROM agent_turns WHERE id = ANY(%s)", (ids,)).fetchall()
    created = {r[0]: r[1].timestamp() for r in rows}
    first_tokens = {k.decode(): float(v) for k, v in redis.hgetall(f"{key}:first-token").items()}
    by_label = dict(zip(ids, [f"{label}-{i}" for i in range(turns)], strict=True))
    ttft = [first_tokens[by_label[i]] - created[i] for i in ids if by_label[i] in first_tokens]
    latencies = [r[2].timestamp() - r[1].timestamp() for r in rows]
    # From the turn's first pick-up (its TURN_RUNNING event) to its end: the wait for a free
    # slot left out, what is left shows whether a turn under way starves behind new ones.
    running_rows = admin.execute(
        "SELECT turn_id, min(created_at) FROM agent_turn_events WHERE type = 'TURN_RUNNING' AND turn_id = ANY(%s) "
        "GROUP BY turn_id",
        (ids,),
    ).fetchall()
    picked_up = {r[0]: r[1].timestamp() for r in running_rows}
    running = [r[2].timestamp() - picked_up[r[0]] for r in rows if r[0] in picked_up]
    first, last = min(created.values()), max(r[2].timestamp() for r in rows)
    steps = turns * STEPS_PER_TURN
    return {
        "turns": turns,
        "rate": rate,
        "elapsed_s": elapsed,
        "turns_per_s": turns / (last - first),
        "starts_per_s": starts_per_s,
        "latency_ms": latency_summary(latencies),
        "running_latency_ms": latency_summary(running) if running else None,
        "ttft_ms": latency_summary(ttft) if ttft else None,
        "peak_inflight": watch.peak_inflight,
        "idle_rss_mb": idle_rss / 2**20,
        "peak_rss_mb": watch.peak_rss / 2**20,
        "rss_per_inflight_kb": (watch.peak_rss - idle_rss) / 1024 / max(1, watch.peak_inflight),
        "worker_cpu_s": cpu["worker_s"],
        "cpu_ms_per_step": cpu["worker_s"] * 1000 / steps,
        "machine_busy": cpu["machine_busy"],
    }


def start_rates(env: dict[str, str], turns: int) -> dict[str, float]:
    """Starts/s of `runner.start` through `build_runner()` from 1 and 4 threads, with no worker competing.

    The turns go to a queue no worker consumes; its keys go with the run's Redis prefix.
    """
    from workers.producer import build_runner
    from workers.settings import WorkerSettings

    runner = build_runner(WorkerSettings.from_env({**env, "AGENT_RUNNER_QUEUE": f"{env['AGENT_RUNNER_QUEUE']}-idle"}))
    try:
        inputs = [json.dumps({"latency": 0, "label": f"start-{i}"}) for i in range(turns)]
        start_turns(runner, inputs[:20], 1, None)  # connections opened, code warm
        return {f"{threads}": start_turns(runner, inputs, threads, None)[1] for threads in (1, 4)}
    finally:
        engine = getattr(runner.turn_store, "engine", None)
        if engine is not None:
            engine.dispose()


def plan(quick: bool) -> list[tuple[str, float, int, float | None]]:
    """(config, L, N, rate) of each run. The old default runs small loads only: it holds four turns at once."""
    if quick:
        return [
            ("threads -c1000 (shipped)", 0.2, 100, None),
            ("threads -c1000 (shipped)", 1.0, 300, None),
            ("threads -c1000 (shipped)", 1.0, 300, 100.0),
            ("prefork -c4 (old default)", 0.2, 40, None),
        ]
    runs: list[tuple[str, float, int, float | None]] = []
    for latency in (0.2, 1.0, 5.0):
        for turns in (100, 1000):
            runs.append(("threads -c1000 (shipped)", latency, turns, None))
        runs.append(("threads -c1000 (shipped)", latency, 1000, 200.0))
    runs += [("threads -c200", 1.0, 1000, None), ("prefork -c4 (old default)", 0.2, 100, None)]
    runs += [("prefork -c4 (old default)", 1.0, 100, None)]
    return runs


def measure(quick: bool) -> dict[str, Any]:
    import psycopg
    from redis import Redis

    from workers.producer import build_runner
    from workers.settings import WorkerSettings

    results: dict[str, Any] = {"runs": [], "service_s": {}}
    folder = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    with pg_schema("bench_latency") as (url, _schema):
        prefix = f"bench-latency-{os.getpid()}"
        env = worker_env(url, prefix, f"{prefix}-queue")
        env.update({"AGENT_RUNNER_AGENT_LOADER": "latency:build_loader", KEY_VARIABLE: f"{prefix}:model"})
        runner = build_runner(WorkerSettings.from_env(env))
        admin = psycopg.connect(libpq(url), autocommit=True)
        redis: Any = Redis.from_url(redis_url())
        ctx = {"runner": runner, "admin": admin, "redis": redis, "key": f"{prefix}:model"}
        os.environ[KEY_VARIABLE] = ctx["key"]
        try:
            results["starts_per_s"] = start_rates(env, 200 if quick else 1000)
            log(f"latency: starts/s {results['starts_per_s']}")
            for config, (pool, concurrency) in CONFIGS.items():
                runs = [r for r in plan(quick) if r[0] == config]
                if not runs:
                    continue
                worker = Worker("workers.app", env, concurrency, folder / f"{pool}-{concurrency}.log", pool=pool)
                try:
                    # Readiness and warm-up: the first turn waits for the worker to come up.
                    run_once(ctx, worker, f"warm-{pool}", 0.01, 1, None)
                    for _, latency, turns, rate in runs:
                        if f"{latency:g}" not in results["service_s"]:
                            alone = run_once(ctx, worker, f"alone-{latency}", latency, 1, None)
                            results["service_s"][f"{latency:g}"] = alone["latency_ms"]["p50"] / 1000
                        log(f"latency: {config}, L={latency}, N={turns}, rate={rate}")
                        row = run_once(
                            ctx, worker, f"{pool}{concurrency}-{latency}-{turns}-{rate}", latency, turns, rate
                        )
                        service = results["service_s"][f"{latency:g}"]
                        cpu_per_turn = row["cpu_ms_per_step"] * STEPS_PER_TURN / 1000
                        ideal = min(concurrency / service, 1 / cpu_per_turn if cpu_per_turn > 0 else float("inf"))
                        row.update({"config": config, "latency_s": latency, "concurrency": concurrency})
                        row["ideal_turns_per_s"] = ideal
                        row["of_ideal"] = row["turns_per_s"] / ideal
                        row["p50_over_service"] = row["latency_ms"]["p50"] / 1000 / service
                        running = row["running_latency_ms"]
                        row["running_p50_over_service"] = None if running is None else running["p50"] / 1000 / service
                        results["runs"].append(row)
                        log(
                            json.dumps({k: row[k] for k in ("turns_per_s", "of_ideal", "peak_inflight", "peak_rss_mb")})
                        )
                finally:
                    worker.stop()
        finally:
            admin.close()
            redis.close()
            engine = getattr(runner.turn_store, "engine", None)
            if engine is not None:
                engine.dispose()
            delete_redis_prefix(redis_url(), prefix)
    return results


SECTION_TITLE = "## 10. Model latency: turns in flight per worker"
"""The heading of this section in docs/benchmarks.md (its anchor is linked from docs/workers.md)."""


def section(results: dict[str, Any]) -> str:
    """This section of docs/benchmarks.md: what was run, then the table."""
    return (
        "One Celery worker process against PostgreSQL and the Redis broker; a model that waits L seconds per call "
        f"and streams {DELTAS} deltas; a turn is 3 model calls and 2 tool steps. *In flight*: most model calls "
        "waiting at once. *Of ideal*: turns/s against the lower of concurrency / service time and 1 / CPU per "
        "turn (what the worker's CPU allows; CPU per step is measured in the same run). Latency is from the "
        "saved READY to the saved COMPLETED (*once running*: from the first pick-up, the wait for a free slot left "
        "out), TTFT to the first delta. RSS counts the worker with its pool "
        "processes; *worker CPU use* is its CPU seconds per second of the run (one core at most for the threads "
        "pool, whose Python runs one thread at a time). `bench/latency.py`.\n\n" + table(results)
    )


def table(results: dict[str, Any]) -> str:
    """The results as a Markdown table (also what docs/benchmarks.md shows)."""
    lines = [
        "| worker | L | N | arrival | in flight | turns/s | of ideal | p50 latency | p99 latency "
        "| p50 / service | p50 once running / service "
        "| p50 TTFT | RSS peak | RSS per in-flight turn | CPU per step | worker CPU use |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["runs"]:
        ttft = "-" if row["ttft_ms"] is None else f"{row['ttft_ms']['p50'] / 1000:.2f} s"
        running = row.get("running_p50_over_service")
        running_text = "-" if running is None else f"{running:.2f}x"
        arrival = "at once" if row["rate"] is None else f"{row['rate']:g}/s"
        lines.append(
            f"| {row['config']} | {row['latency_s']:g} s | {row['turns']} | {arrival} | {row['peak_inflight']} "
            f"| {row['turns_per_s']:.1f} | {row['of_ideal']:.0%} | {row['latency_ms']['p50'] / 1000:.2f} s "
            f"| {row['latency_ms']['p99'] / 1000:.2f} s | {row['p50_over_service']:.2f}x | {running_text} "
            f"| {ttft} | {row['peak_rss_mb']:.0f} MB "
            f"| {row['rss_per_inflight_kb']:.0f} KB | {row['cpu_ms_per_step']:.2f} ms "
            f"| {row['worker_cpu_s'] / row['elapsed_s']:.0%} |"
        )
    service = ", ".join(
        f"L={k} s: {v:.2f} s" for k, v in sorted(results["service_s"].items(), key=lambda i: float(i[0]))
    )
    starts = results.get("starts_per_s", {})
    rates = ", ".join(f"{rate:.0f}/s from {threads} thread(s)" for threads, rate in starts.items())
    return (
        "\n".join(lines)
        + f"\n\nService time of one turn alone: {service}. `runner.start` with no worker running: {rates}."
    )


def main() -> None:
    args = arguments(__doc__)
    log("latency: turns with a model that waits")
    results = measure(args.quick)
    write_results(args.json, results)
    print(table(results))


if __name__ == "__main__":
    main()
