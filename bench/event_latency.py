"""Delta latency: from `on_delta` in a Celery worker to followers in other processes.

A real `celery worker` process runs turns of an agent whose model streams `--deltas`
deltas, one every `--interval` seconds; each delta's text is `time.time()` taken just
before the model passes it to `ChatRequest.on_delta`. The runner publishes it to the
Redis live channel (`store.RedisLiveEvents`, as every worker does). Followers in other
processes follow the conversation and record, for every MODEL_DELTA, their clock at
arrival minus the time in its text (one machine, one clock).

Two ways of following, each with 1 and with 100 concurrent followers (threads spread
over up to `--processes` processes, all following the same conversation):

- `EventFeed.follow`: the durable log in PostgreSQL merged with the live channel, what
  the HTTP server streams (each wake-up reads both sources);
- `RedisLiveEvents.wait`: the live channel alone (XREAD BLOCK on the conversation's stream).

Each case runs `--turns` turns one after the other in a conversation of its own; the
followers subscribe (and have read once) before the first turn starts. Latencies are
printed as p50 and p99 in milliseconds.

Run: `python bench/event_latency.py [--quick] [--json PATH]`. PostgreSQL and Redis must
be up (see `_common.py` for their URLs). The worker runs in its own process group and is
stopped by that group's id; follower processes are stopped by their pid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import (
    HERE,
    ROOT,
    TickerModel,
    arguments,
    delete_redis_prefix,
    latency_summary,
    log,
    pg_schema,
    redis_url,
    stop_process_group,
    write_results,
)

import store
from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    EventFeed,
    EventScope,
    InMemoryAgentLoader,
)

CELERY = str(Path(sys.executable).with_name("celery"))
AGENT_ID = "ticker"
MODES = {"feed": "EventFeed.follow", "raw": "RedisLiveEvents.wait"}
FOLLOWER_COUNTS = (1, 100)
START_TIMEOUT_S = 60.0
TURN_TIMEOUT_S = 120.0
FOLLOW_IDLE_S = 60.0


# --- The worker side: an agent whose model streams timestamps ----------------------------------


def build_loader() -> InMemoryAgentLoader:
    """The benchmark's agent, for the worker process (`AGENT_RUNNER_AGENT_LOADER=event_latency:build_loader`)."""
    return InMemoryAgentLoader([Agent(id=AGENT_ID, chat_model=TickerModel(), max_iterations=2)])


def worker_env(database_url: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_RUNNER_", "CELERY_"))}
    env.update(
        {
            "AGENT_RUNNER_DATABASE_URL": database_url,
            "AGENT_RUNNER_REDIS_URL": redis_url(),
            "CELERY_BROKER_URL": redis_url(),
            "AGENT_RUNNER_REDIS_PREFIX": prefix,
            "AGENT_RUNNER_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            "AGENT_RUNNER_QUEUE": f"{prefix}-queue",
            "AGENT_RUNNER_AGENT_LOADER": "event_latency:build_loader",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    return env


class Worker:
    """A `celery worker` process (one pool process) in its own process group."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        args = [CELERY, "-A", "workers.app", "worker", "--pool=prefork", "--concurrency=1"]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING"]
        args += [f"--hostname=event-latency-{uuid.uuid4().hex[:6]}@%h"]
        self.log_path = log_path
        with log_path.open("wb") as sink:
            self.process = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )

    def check(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        stop_process_group(self.process)


# --- The follower side ------------------------------------------------------------------------


def _ended(event: AgentEvent) -> bool:
    """Whether the event ends a root turn of the conversation."""
    return event.type.is_terminal and event.turn_id == event.root_turn_id


def _through_feed(feed: EventFeed, conversation: str, turns: int, subscribed: threading.Barrier) -> list[float]:
    """Follow with `EventFeed.follow` until `turns` root turns ended; the latency of each delta, in seconds."""
    latencies: list[float] = []
    ended = 0
    feed.read(EventScope.conversation(conversation))  # connected to both sources before the turns start
    subscribed.wait()
    for event in feed.follow(EventScope.conversation(conversation), timeout=FOLLOW_IDLE_S):
        if event.type is AgentEventType.MODEL_DELTA:
            latencies.append(time.time() - float(event.data["delta"]))
        elif _ended(event):
            ended += 1
            if ended == turns:
                return latencies
    raise RuntimeError(f"saw {ended} of {turns} turns end")


def _through_live(
    live: store.RedisLiveEvents, conversation: str, turns: int, subscribed: threading.Barrier
) -> list[float]:
    """Follow with `RedisLiveEvents.wait` alone until `turns` root turns ended (their wake-ups); the latencies."""
    latencies: list[float] = []
    ended = 0
    live.read(EventScope.conversation(conversation))
    subscribed.wait()
    cursor: str | None = None
    idle_until = time.monotonic() + FOLLOW_IDLE_S
    while ended < turns:
        if time.monotonic() > idle_until:
            raise RuntimeError(f"saw {ended} of {turns} turns end")
        events = live.wait(EventScope.conversation(conversation), after=cursor, timeout=5.0)
        arrived = time.time()
        for event in events:
            cursor = event.cursor
            idle_until = time.monotonic() + FOLLOW_IDLE_S
            if event.type is AgentEventType.MODEL_DELTA:
                latencies.append(arrived - float(event.data["delta"]))
            elif _ended(event):
                ended += 1
    return latencies


def follow(args: argparse.Namespace) -> None:
    """A follower process: `--threads` threads follow the conversation; prints their latencies as JSON."""
    import sqlalchemy as sa

    # A few connections shared by the threads: 100 followers must not take 100 of the server's.
    engine = sa.create_engine(args.database_url, pool_size=4, max_overflow=0, pool_timeout=60)
    turn_store = store.SqlAgentTurnStore(engine)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    subscribed = threading.Barrier(args.threads + 1, timeout=START_TIMEOUT_S)

    def run() -> None:
        live = store.RedisLiveEvents(redis_url(), prefix=args.prefix)
        try:
            if args.mode == "feed":
                mine = _through_feed(EventFeed(turn_store, live), args.conversation, args.turns, subscribed)
            else:
                mine = _through_live(live, args.conversation, args.turns, subscribed)
            with lock:
                latencies.extend(mine)
        except Exception as exc:
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            live.close()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    subscribed.wait()
    print("ready", flush=True)
    for thread in threads:
        thread.join()
    turn_store.close()
    engine.dispose()
    print(json.dumps({"latencies": latencies, "errors": errors}), flush=True)


# --- The producer: start turns, gather the followers' figures -----------------------------------


class Case:
    """One measurement: `followers` followers in `mode`, over `turns` turns of `deltas` deltas."""

    def __init__(self, database_url: str, prefix: str, mode: str, followers: int, processes: int) -> None:
        self.database_url = database_url
        self.prefix = prefix
        self.mode = mode
        self.followers = followers
        self.processes = min(processes, followers)
        self.conversation = f"latency-{mode}-{followers}-{uuid.uuid4().hex[:6]}"

    def spawn(self, turns: int) -> list[subprocess.Popen[str]]:
        shares = [
            self.followers // self.processes + (i < self.followers % self.processes) for i in range(self.processes)
        ]
        spawned = []
        for threads in shares:
            args = [sys.executable, str(Path(__file__).resolve()), "--follow", "--mode", self.mode]
            args += ["--threads", str(threads), "--turns", str(turns), "--conversation", self.conversation]
            args += ["--database-url", self.database_url, "--prefix", self.prefix]
            spawned.append(subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT))
        for process in spawned:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a follower process failed to start (exit {process.poll()}): {line!r}")
        return spawned


def wait_ended(runner: Any, turn_id: str, worker: Worker) -> None:
    deadline = time.monotonic() + TURN_TIMEOUT_S
    while not runner.turn_store.load(turn_id).is_terminal:
        worker.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"turn {turn_id} did not end in {TURN_TIMEOUT_S} s")
        time.sleep(0.02)


def measure(quick: bool, processes: int, deltas: int | None, interval: float) -> dict[str, Any]:
    from workers.producer import build_runner
    from workers.settings import WorkerSettings

    turns = 1 if quick else 3
    deltas = deltas if deltas is not None else (20 if quick else 50)
    spec = json.dumps({"deltas": deltas, "interval": interval})
    prefix = f"bench-evlat-{uuid.uuid4().hex[:8]}"
    results: dict[str, Any] = {
        "turns": turns,
        "deltas_per_turn": deltas,
        "interval_s": interval,
        "cases": [],
        "load_average_before": os.getloadavg()[0],
    }
    with pg_schema("evlat") as (database_url, _), tempfile.TemporaryDirectory() as folder:
        env = worker_env(database_url, prefix)
        worker = Worker(env, Path(folder) / "worker.log")
        runner = build_runner(WorkerSettings.from_env(env))
        try:
            # Warm-up: the worker is up, has built its wiring and streamed once.
            started = time.monotonic()
            warm = runner.start(AGENT_ID, json.dumps({"deltas": 2, "interval": 0.0}))
            wait_ended(runner, warm.id, worker)
            log(f"worker ready in {time.monotonic() - started:.1f} s")
            for mode in MODES:
                for count in FOLLOWER_COUNTS:
                    case = Case(database_url, prefix, mode, count, processes)
                    followers = case.spawn(turns)
                    try:
                        for _ in range(turns):
                            turn = runner.start(AGENT_ID, spec, conversation_id=case.conversation)
                            wait_ended(runner, turn.id, worker)
                        latencies: list[float] = []
                        for process in followers:
                            out, _ = process.communicate(timeout=FOLLOW_IDLE_S + 30)
                            report = json.loads(out.strip().splitlines()[-1])
                            if report["errors"]:
                                raise RuntimeError(f"followers failed: {report['errors'][:3]}")
                            latencies += report["latencies"]
                    finally:
                        for process in followers:
                            if process.poll() is None:
                                process.kill()
                                process.wait(10)
                    expected = count * turns * deltas
                    if len(latencies) != expected:
                        raise RuntimeError(f"{MODES[mode]} x{count}: {len(latencies)} deltas arrived, {expected} sent")
                    summary = latency_summary(latencies)
                    results["cases"].append({"mode": MODES[mode], "followers": count, **summary})
                    log(f"  {MODES[mode]} x{count}: p50 {summary['p50']:.2f} ms, p99 {summary['p99']:.2f} ms")
            results["load_average_after"] = os.getloadavg()[0]
        finally:
            worker.stop()
            turn_store = runner.turn_store
            close = getattr(turn_store, "close", None)
            if close is not None:
                close()
            delete_redis_prefix(redis_url(), prefix)
    return results


def main() -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--processes", type=int, default=4, help="follower processes the followers share")
        parser.add_argument("--deltas", type=int, default=None, help="deltas per turn (default 50; 20 with --quick)")
        parser.add_argument("--interval", type=float, default=0.02, help="seconds between deltas")
        # Internal: the follower processes run this script again.
        parser.add_argument("--follow", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--mode", choices=sorted(MODES), default="feed", help=argparse.SUPPRESS)
        parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
        parser.add_argument("--turns", type=int, default=1, help=argparse.SUPPRESS)
        parser.add_argument("--conversation", default="", help=argparse.SUPPRESS)
        parser.add_argument("--database-url", default="", help=argparse.SUPPRESS)
        parser.add_argument("--prefix", default="", help=argparse.SUPPRESS)

    args = arguments(__doc__, extra)
    if args.follow:
        follow(args)
        return
    log("Event latency: on_delta in a Celery worker -> followers in other processes")
    results = measure(args.quick, args.processes, args.deltas, args.interval)
    write_results(args.json, results)
    print(
        f"{results['turns']} turn(s) x {results['deltas_per_turn']} deltas, one every "
        f"{results['interval_s'] * 1000:g} ms; latency from on_delta to arrival, ms "
        f"(1-minute load average {results['load_average_before']:.1f} before, "
        f"{results['load_average_after']:.1f} after, on {os.cpu_count()} cores)"
    )
    print("| followed with | followers | deltas received | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for case in results["cases"]:
        print(f"| {case['mode']} | {case['followers']} | {case['n']} | {case['p50']:.2f} | {case['p99']:.2f} |")


if __name__ == "__main__":
    main()
