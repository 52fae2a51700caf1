"""Celery: the runner's `step_turn` tasks against a raw Celery chain, with 1 and 2 worker processes.

For each pool size, two real `celery worker` processes run side by side: the runner's app
(`celery -A workers.app worker`, PostgreSQL store, Redis lease and guard, Redis broker)
and the raw chain (`celery -A raw_chain worker`: the same Celery settings on the same
broker, a no-op task that re-enqueues itself). Repetitions alternate between the two, so
both see the same machine; the idle one waits on the broker.

Throughput: N turns of W(K) are started at once through `workers.build_runner()` (saved
READY and enqueued) and the clock stops when the last one has completed. The raw chain
gets N chains of 2K+1 hops, one hop per step the runner takes. The ratio is the runner's
steps/s over the raw chain's hops/s: above 1 the runner, which may take several steps
per task under one lease (AGENT_RUNNER_STEPS_PER_TASK, default 16), beats one hop per step.

Resume latency: turns of the approval workload wait for approval (run there by the
worker); the clock starts before `submit_resume` (save, then a `step_turn` message) and
stops when PostgreSQL notifies the COMPLETED save (a trigger in the benchmark's schema
calls `pg_notify`; the listening connection gets it at commit).

Run: `python bench/celery_bench.py [--quick] [--json PATH]`. Worker processes run in
their own process group and are stopped by that group's id (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    HERE,
    ROOT,
    Stat,
    arguments,
    delete_redis_prefix,
    latency_summary,
    libpq,
    log,
    pg_schema,
    prior_messages,
    redis_url,
    steps_per_turn,
    stop_process_group,
    w_agent,
    write_results,
)

from agent_runner import AgentResumeCommand

CELERY = str(Path(sys.executable).with_name("celery"))
START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 300.0


def worker_env(database_url: str, prefix: str, queue: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_RUNNER_", "CELERY_"))}
    env.update(
        {
            "AGENT_RUNNER_DATABASE_URL": database_url,
            "AGENT_RUNNER_REDIS_URL": redis_url(),
            "CELERY_BROKER_URL": redis_url(),
            "AGENT_RUNNER_REDIS_PREFIX": prefix,
            "AGENT_RUNNER_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            "AGENT_RUNNER_QUEUE": queue,
            "AGENT_RUNNER_AGENT_LOADER": "_common:build_loader",
            "AGENT_RUNNER_MAX_STEPS": "1000",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    return env


class Worker:
    """A `celery worker` process in its own process group, logging to a file."""

    def __init__(
        self, app: str, env: dict[str, str], concurrency: int, log_path: Path, *, pool: str = "prefork"
    ) -> None:
        args = [CELERY, "-A", app, "worker", f"--pool={pool}", f"--concurrency={concurrency}"]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING"]
        args += [f"--hostname={app}-{uuid.uuid4().hex[:6]}@%h"]
        self.log_path = log_path
        with log_path.open("wb") as sink:
            self.process = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )

    def cpu_seconds(self) -> float:
        """User and system CPU of the worker's main process and its pool processes so far."""
        import psutil

        total = 0.0
        try:
            main = psutil.Process(self.process.pid)
            for process in [main, *main.children(recursive=True)]:
                try:
                    times = process.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
        return total

    def check(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        stop_process_group(self.process)


class Bench:
    """The producer side: a runner wired like a web app's, a raw-chain sender, and watchers."""

    def __init__(self, database_url: str, prefix: str) -> None:
        from workers.producer import build_runner
        from workers.settings import WorkerSettings

        self.database_url = database_url
        self.prefix = prefix
        self.runner_env = worker_env(database_url, prefix, f"{prefix}-runner")
        self.raw_env = worker_env(database_url, prefix, f"{prefix}-raw")
        self.settings = WorkerSettings.from_env(self.runner_env)
        # Agents come from AGENT_RUNNER_AGENT_LOADER, as in the workers.
        self.runner = build_runner(self.settings)
        raw_settings = WorkerSettings.from_env(self.raw_env)
        from celery import Celery

        from workers.celery_app.config import celery_config

        self.raw_app = Celery("bench_raw_chain_producer")
        self.raw_app.conf.update(celery_config(raw_settings))
        self.raw_queue = raw_settings.queue
        from redis import Redis

        self.redis: Any = Redis.from_url(redis_url())
        self.done_key = f"{prefix}:raw-chain-done"
        self.admin = psycopg.connect(libpq(database_url), autocommit=True)

    def close(self) -> None:
        self.admin.close()
        self.redis.close()
        turn_store = self.runner.turn_store
        engine = getattr(turn_store, "engine", None)
        if engine is not None:
            engine.dispose()

    # --- runner side ---

    def run_turns(self, k: int, turns: int, *, window: int = 50, conversations: list[str] | None = None) -> float:
        agent_id = w_agent(k, window=window).id
        started = time.perf_counter()
        ids = [
            self.runner.start(
                agent_id, "check my orders", conversation_id=conversations[i] if conversations else None
            ).id
            for i in range(turns)
        ]
        self.wait_turns(ids, steps_per_turn(k))
        return time.perf_counter() - started

    def wait_turns(self, ids: list[str], steps: int | None, statuses: tuple[str, ...] = ("COMPLETED",)) -> None:
        """Wait until every turn reached one of `statuses` (or ended otherwise), then check how they ended."""
        ended = (*statuses, "COMPLETED", "FAILED", "CANCELLED", "MAX_STEPS_REACHED", "MAX_ITERATIONS_REACHED")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            row = self.admin.execute(
                "SELECT count(*) FROM agent_turns WHERE id = ANY(%s) AND status = ANY(%s)", (ids, list(ended))
            ).fetchone()
            if row is not None and row[0] == len(ids):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"turns still running after {RUN_TIMEOUT_S} s")
            time.sleep(0.005)
        rows = self.admin.execute(
            "SELECT id, status, (state->>'steps')::int FROM agent_turns WHERE id = ANY(%s)", (ids,)
        ).fetchall()
        bad = [r for r in rows if r[1] not in statuses or (steps is not None and r[2] != steps)]
        if bad:
            raise RuntimeError(f"turns ended unexpectedly: {bad[:3]}")

    # --- raw chain side ---

    def run_chains(self, chains: int, hops: int) -> float:
        from raw_chain import HOP

        self.redis.delete(self.done_key)
        started = time.perf_counter()
        for index in range(chains):
            self.raw_app.send_task(HOP, args=(f"c{index}", hops - 1), queue=self.raw_queue)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while self.redis.llen(self.done_key) < chains:
            if time.monotonic() > deadline:
                raise TimeoutError("raw chains did not finish")
            time.sleep(0.005)
        return time.perf_counter() - started


def seed_conversations(bench: Bench, count: int, tag: str) -> list[str]:
    memories = bench.runner.chat_memory_provider
    assert memories is not None
    ids = []
    for index in range(count):
        conversation = f"prior-{tag}-{index}"
        memories(conversation).append(prior_messages(500, f"{tag}{index}"))
        ids.append(conversation)
    return ids


class CpuMeter:
    """CPU seconds used by a worker, by this process (the producer and watcher) and by the whole machine."""

    def __init__(self, worker: Worker) -> None:
        import psutil

        self.worker = worker
        self.me = psutil.Process()
        self.worker_start = worker.cpu_seconds()
        mine = self.me.cpu_times()
        self.me_start = mine.user + mine.system
        system = psutil.cpu_times()
        self.busy_start = system.user + system.system + getattr(system, "nice", 0.0)
        self.started = time.perf_counter()

    def read(self) -> dict[str, float]:
        import psutil

        mine = self.me.cpu_times()
        system = psutil.cpu_times()
        elapsed = time.perf_counter() - self.started
        busy = system.user + system.system + getattr(system, "nice", 0.0) - self.busy_start
        return {
            "worker_s": self.worker.cpu_seconds() - self.worker_start,
            "bench_s": mine.user + mine.system - self.me_start,
            "machine_busy": busy / (elapsed * (psutil.cpu_count() or 1)),
        }


def throughput(bench: Bench, workers: dict[str, Worker], concurrency: int, reps: int, scale: float) -> dict[str, Any]:
    workloads: list[dict[str, Any]] = [
        {"label": "W K=10", "k": 10, "turns": 24},
        {"label": "W K=200", "k": 200, "turns": 4},
        {"label": "W K=10, 500 prior, window 500", "k": 10, "turns": 12, "window": 500},
    ]
    results: dict[str, Any] = {}
    for workload in workloads:
        k = workload["k"]
        turns = max(2 * concurrency, round(workload["turns"] * scale))
        runner_rates: list[float] = []
        raw_rates: list[float] = []
        cpu: dict[str, list[dict[str, float]]] = {"runner": [], "raw": []}
        steps = turns * steps_per_turn(k)
        for _ in range(reps):
            conversations = None
            if workload.get("window"):
                conversations = seed_conversations(bench, turns, uuid.uuid4().hex[:8])
            gc.collect()
            meter = CpuMeter(workers["runner"])
            seconds = bench.run_turns(k, turns, window=workload.get("window", 50), conversations=conversations)
            cpu["runner"].append(meter.read())
            runner_rates.append(steps / seconds)
            gc.collect()
            meter = CpuMeter(workers["raw"])
            raw_seconds = bench.run_chains(turns, steps_per_turn(k))
            cpu["raw"].append(meter.read())
            raw_rates.append(steps / raw_seconds)
        ratios = [r / h for r, h in zip(runner_rates, raw_rates, strict=True)]
        results[workload["label"]] = {
            "k": k,
            "turns": turns,
            "runner_steps_per_s": Stat.of(runner_rates).as_dict(),
            "runner_turns_per_s": Stat.of([r / steps_per_turn(k) for r in runner_rates]).as_dict(),
            "raw_hops_per_s": Stat.of(raw_rates).as_dict(),
            "raw_chains_per_s": Stat.of([r / steps_per_turn(k) for r in raw_rates]).as_dict(),
            "ratio": Stat.of(ratios).as_dict(),
            "cpu": {
                side: {
                    "worker_ms_per_step": Stat.of([m["worker_s"] * 1000 / steps for m in measured]).as_dict(),
                    "bench_ms_per_step": Stat.of([m["bench_s"] * 1000 / steps for m in measured]).as_dict(),
                    "machine_busy": Stat.of([m["machine_busy"] for m in measured]).as_dict(),
                }
                for side, measured in cpu.items()
            },
        }
        log(
            f"  {concurrency} process(es), {workload['label']}: runner {Stat.of(runner_rates).median:,.0f} steps/s, "
            f"raw chain {Stat.of(raw_rates).median:,.0f} hops/s"
        )
    return results


def install_completion_trigger(admin: Any) -> None:
    admin.execute(
        "CREATE OR REPLACE FUNCTION bench_notify_completed() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN PERFORM pg_notify('bench_completed', NEW.id); RETURN NEW; END $$"
    )
    admin.execute(
        "CREATE TRIGGER bench_completed AFTER UPDATE ON agent_turns FOR EACH ROW"
        " WHEN (NEW.status = 'COMPLETED' AND OLD.status IS DISTINCT FROM 'COMPLETED')"
        " EXECUTE FUNCTION bench_notify_completed()"
    )


def resume_latency(bench: Bench, reps: int, samples: int) -> dict[str, Any]:
    install_completion_trigger(bench.admin)
    listener = psycopg.connect(libpq(bench.database_url), autocommit=True)
    listener.execute("LISTEN bench_completed")
    try:
        runs: list[list[float]] = []
        warm = 5
        for rep in range(reps + 1):
            count = warm if rep == 0 else samples
            ids = [bench.runner.start("approval", "refund order 1001").id for _ in range(count)]
            bench.wait_turns(ids, None, statuses=("WAITING_FOR_APPROVAL",))
            list(listener.notifies(timeout=0.05))  # drop anything stale
            gc.collect()
            latencies = []
            for turn_id in ids:
                turn = bench.runner.turn_store.load(turn_id)
                assert turn.suspension is not None
                command = AgentResumeCommand.approve_tool(turn.suspension.correlation_id)
                time.sleep(0.01)  # the worker is idle, as between real approvals
                started = time.perf_counter()
                bench.runner.submit_resume(turn_id, command)
                got = None
                for notice in listener.notifies(timeout=10, stop_after=1):
                    got = notice.payload
                if got != turn_id:
                    raise RuntimeError(f"expected completion of {turn_id}, got {got!r}")
                latencies.append(time.perf_counter() - started)
            if rep > 0:
                runs.append(latencies)
    finally:
        listener.close()
    summaries = [latency_summary(values) for values in runs]
    result = {
        "samples_per_rep": samples,
        "p50": Stat.of([s["p50"] for s in summaries]).as_dict(),
        "p99": Stat.of([s["p99"] for s in summaries]).as_dict(),
        "pooled": latency_summary([v for values in runs for v in values]),
    }
    log(f"  Celery resume: p50 {result['p50']['median']:.2f} ms, p99 {result['p99']['median']:.2f} ms")
    return result


POOLS = (
    # key, worker processes, steps per task (None: the default of `WorkerSettings`)
    ("1", 1, None),
    ("2", 2, None),
    ("2, 4 steps/task", 2, 4),
)


def measure(quick: bool) -> dict[str, Any]:
    reps = 3 if quick else 5
    scale = 0.34 if quick else 1.0
    prefix = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    results: dict[str, Any] = {"steps_per_task": None, "pools": {}}
    logs = Path(tempfile.mkdtemp(prefix="agent-runner-bench-"))
    with pg_schema("bench") as (url, _schema):
        bench = Bench(url, prefix)
        results["steps_per_task"] = bench.settings.steps_per_task
        try:
            for key, concurrency, steps_per_task in POOLS:
                runner_env = dict(bench.runner_env)
                if steps_per_task is not None:
                    runner_env["AGENT_RUNNER_STEPS_PER_TASK"] = str(steps_per_task)
                name = key.replace(", ", "-").replace(" ", "").replace("/", "")
                workers = {
                    "runner": Worker("workers.app", runner_env, concurrency, logs / f"runner-{name}.log"),
                    "raw": Worker("raw_chain", bench.raw_env, concurrency, logs / f"raw-{name}.log"),
                }
                try:
                    started = time.monotonic()
                    # Readiness and warm-up: every pool process has run tasks of both kinds.
                    bench.run_turns(1, 4 * concurrency)
                    bench.run_chains(4 * concurrency, 3)
                    log(f"  pool {key}: ready after {time.monotonic() - started:.1f} s")
                    pool: dict[str, Any] = {
                        "processes": concurrency,
                        "steps_per_task": steps_per_task or bench.settings.steps_per_task,
                        "throughput": throughput(bench, workers, concurrency, reps, scale),
                    }
                    if key == "1":
                        pool["resume"] = resume_latency(bench, reps, 10 if quick else 40)
                    results["pools"][key] = pool
                    for worker in workers.values():
                        worker.check()
                finally:
                    for worker in workers.values():
                        worker.stop()
        finally:
            bench.close()
            delete_redis_prefix(redis_url(), prefix)
    return results


def main() -> None:
    args = arguments(__doc__)
    log("Celery: runner against a raw chain")
    results = measure(args.quick)
    write_results(args.json, results)
    print("| pool | workload | runner steps/s | runner turns/s | raw hops/s | runner / raw |")
    print("|---|---|---|---|---|---|")
    for concurrency, pool in results["pools"].items():
        for label, entry in pool["throughput"].items():
            print(
                f"| {concurrency} | {label} | {entry['runner_steps_per_s']['median']:,.0f} "
                f"| {entry['runner_turns_per_s']['median']:,.1f} | {entry['raw_hops_per_s']['median']:,.0f} "
                f"| {entry['ratio']['median']:.2f}x |"
            )
    resume = results["pools"]["1"]["resume"]
    print(f"resume through Celery: p50 {resume['p50']['median']:.2f} ms, p99 {resume['p99']['median']:.2f} ms")


if __name__ == "__main__":
    main()
