"""SSE: many followers of one conversation through `agent-runner serve`; delivery latency and server memory.

The server is a real `agent-runner serve --worker celery` process on PostgreSQL and Redis,
as deployed with Celery workers: its event streams read the durable log in PostgreSQL and
the live channel in Redis. The turns run in this process instead of a Celery worker, with
the same wiring a worker has (SQL store, chat memory, `RedisLiveEvents` fed by a
`BackgroundPublisher`): an agent whose model streams `--deltas` deltas, one every
`--interval` seconds, then answers.

`--followers` clients (asyncio, in `--processes` processes of their own) open
`GET /v1/conversations/{id}/events` before the first turn starts and read until the
turns have ended. For every event received, the latency is the client's clock at
arrival minus the event's `timestamp`, which the runner sets when it creates the event:
for a delta, just before it is published; for a durable event, just before the save it
is written with (so its latency includes the save). One machine, one clock.

The server's resident set size and thread count are sampled during the run: before the
followers connect (after a warm-up turn), and at their peak while the followers are
connected. Its CPU time during the streaming part is reported too.

    python bench/sse_bench.py [--quick] [--json PATH] [--followers N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
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
    machine_facts,
    pg_schema,
    redis_url,
    stop_process_group,
    write_results,
)

from agent_runner import Agent, InMemoryAgentLoader

AGENT_ID = "ticker"
AGENT_RUNNER = str(Path(sys.executable).with_name("agent-runner"))
START_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 300.0
SAMPLE_S = 0.1
LATE_DELTAS_S = 5.0


# --- The agent: a model that streams deltas ----------------------------------------------------


def build_loader() -> InMemoryAgentLoader:
    """The benchmark's agent, for the server and the producer (`sse_bench:build_loader`)."""
    return InMemoryAgentLoader([Agent(id=AGENT_ID, chat_model=TickerModel(), max_iterations=2)])


# --- The server -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(database_url: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_RUNNER_", "CELERY_"))}
    env.update(
        {
            "AGENT_RUNNER_DATABASE_URL": database_url,
            "AGENT_RUNNER_REDIS_URL": redis_url(),
            "CELERY_BROKER_URL": redis_url(),
            "AGENT_RUNNER_REDIS_PREFIX": prefix,
            "AGENT_RUNNER_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            "AGENT_RUNNER_QUEUE": f"{prefix}-queue",
            "AGENT_RUNNER_AGENT_LOADER": "sse_bench:build_loader",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    return env


class Server:
    """`agent-runner serve --worker celery` in a process group of its own."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [AGENT_RUNNER, "serve", "--agents", "sse_bench:build_loader", "--port", str(self.port)]
        command += ["--worker", "celery"]
        with log_path.open("wb") as sink:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        stop_process_group(self.process)


class Sampler:
    """Samples a process's RSS and thread count on a thread, until stopped."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.process = psutil.Process(pid)
        self.peak_rss = 0
        self.peak_threads = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
        self.peak_threads = max(self.peak_threads, self.process.num_threads())

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self.sample()


# --- The followers ------------------------------------------------------------------------------


def _parse(block: str) -> tuple[str | None, dict[str, Any] | None]:
    kind: str | None = None
    data: dict[str, Any] | None = None
    for line in block.split("\n"):
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
    return kind, data


async def _one_stream(client: Any, path: str, turns: int, deltas: int, opened: list[int], found: list[Any]) -> None:
    """Read one stream until `turns` root turns ended and their deltas came; record (type, latency s) of each event.

    An event that arrives twice on the stream is an error.

    A delta may arrive after the terminal event of its turn (the durable log and the live
    channel are two paths), so the stream is read on until every delta came, or for
    `LATE_DELTAS_S` after the last turn ended.
    """
    ended = 0
    seen = 0
    ids: set[str] = set()
    late_until: float | None = None
    buffer = ""
    async with client.stream("GET", path) as response:
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code}")
        first = True
        chunks = response.aiter_text()
        while True:
            wait = None if late_until is None else max(0.0, late_until - time.monotonic())
            try:
                chunk = await asyncio.wait_for(anext(chunks), wait)
            except (StopAsyncIteration, TimeoutError):
                return
            arrived = time.time()
            if first:
                opened[0] += 1
                first = False
            buffer += chunk
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                kind, data = _parse(block)
                if kind is None or data is None or "timestamp" not in data:
                    continue
                if data["event_id"] in ids:
                    raise RuntimeError(f"event {data['event_id']} arrived twice on one stream")
                ids.add(data["event_id"])
                sent = datetime.fromisoformat(data["timestamp"]).timestamp()
                found.append((kind, arrived - sent))
                seen += kind == "MODEL_DELTA"
                if kind in TERMINAL and data["turn_id"] == data.get("root_turn_id", data["turn_id"]):
                    ended += 1
                    if ended == turns:
                        late_until = time.monotonic() + LATE_DELTAS_S
                if ended == turns and seen == turns * deltas:
                    return


TERMINAL = {"TURN_COMPLETED", "TURN_FAILED", "TURN_CANCELLED", "MAX_ITERATIONS_REACHED", "MAX_STEPS_REACHED"}


async def _follow_all(url: str, conversation: str, streams: int, turns: int, deltas: int) -> dict[str, Any]:
    import httpx

    opened = [0]
    found: list[Any] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(RUN_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        path = f"/v1/conversations/{conversation}/events"
        tasks = [asyncio.create_task(_one_stream(client, path, turns, deltas, opened, found)) for _ in range(streams)]
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while opened[0] < streams:
            failed = [t for t in tasks if t.done() and t.exception() is not None]
            if failed:
                raise RuntimeError(f"a stream failed: {failed[0].exception()!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {opened[0]} of {streams} streams opened")
            await asyncio.sleep(0.05)
        print("ready", flush=True)
        await asyncio.wait_for(asyncio.gather(*tasks), RUN_TIMEOUT_S)
    return {"events": found}


def follow(args: argparse.Namespace) -> None:
    """A follower process: `--streams` streams of the conversation; prints what they received as JSON."""
    results = asyncio.run(_follow_all(args.url, args.conversation, args.streams, args.turns, args.deltas))
    print(json.dumps(results), flush=True)


def spawn_followers(url: str, conversation: str, followers: int, processes: int, turns: int, deltas: int) -> list[Any]:
    processes = max(1, min(processes, followers))
    shares = [followers // processes + (i < followers % processes) for i in range(processes)]
    spawned: list[subprocess.Popen[str]] = []
    for streams in shares:
        args = [sys.executable, str(Path(__file__).resolve()), "--follow", "--url", url]
        args += ["--conversation", conversation, "--streams", str(streams), "--turns", str(turns)]
        args += ["--deltas", str(deltas)]
        spawned.append(subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT))
    for process in spawned:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"a follower process failed to connect (exit {process.poll()}): {line!r}")
    return spawned


# --- The run --------------------------------------------------------------------------------------


def measure(followers: int, processes: int, turns: int, deltas: int, interval: float) -> dict[str, Any]:
    import psutil

    import store
    from agent_runner import AgentRunner
    from store.redis_events import BackgroundPublisher

    spec = json.dumps({"deltas": deltas, "interval": interval})
    prefix = f"bench-sse-{uuid.uuid4().hex[:8]}"
    results: dict[str, Any] = {
        "followers": followers,
        "processes": max(1, min(processes, followers)),
        "turns": turns,
        "deltas_per_turn": deltas,
        "interval_s": interval,
        "load_average_before": os.getloadavg()[0],
    }
    with pg_schema("ssebench") as (database_url, _), tempfile.TemporaryDirectory() as folder:
        engine = store.make_engine(database_url)
        turn_store = store.SqlAgentTurnStore(engine)
        runner = AgentRunner(
            turn_store=turn_store, agent_loader=build_loader(), chat_memory_provider=store.SqlChatMemoryProvider(engine)
        )
        live = store.RedisLiveEvents(redis_url(), prefix=prefix)
        publisher = BackgroundPublisher(live)
        runner.add_event_listener(publisher)
        server = Server(server_env(database_url, prefix), Path(folder) / "server.log")
        spawned: list[subprocess.Popen[str]] = []
        try:
            # Warm-up: one follower through one short turn, so imports, pools and caches are in place.
            warm = f"warm-{uuid.uuid4().hex[:6]}"
            spawned = spawn_followers(server.url, warm, 1, 1, 1, 3)
            runner.run(AGENT_ID, json.dumps({"deltas": 3, "interval": 0.0}), conversation_id=warm)
            for process in spawned:
                process.communicate(timeout=60)
            time.sleep(1.0)
            server_process = psutil.Process(server.process.pid)
            results["server_rss_idle_bytes"] = server_process.memory_info().rss
            results["server_threads_idle"] = server_process.num_threads()
            sampler = Sampler(server.process.pid)
            conversation = f"sse-{uuid.uuid4().hex[:8]}"
            connect_started = time.monotonic()
            spawned = spawn_followers(server.url, conversation, followers, processes, turns, deltas)
            results["connect_s"] = time.monotonic() - connect_started
            time.sleep(0.5)
            sampler.sample()
            results["server_rss_connected_bytes"] = server_process.memory_info().rss
            cpu_before = server_process.cpu_times()
            started = time.monotonic()
            for _ in range(turns):
                turn = runner.run(AGENT_ID, spec, conversation_id=conversation)
                if turn.status.value != "COMPLETED":
                    raise RuntimeError(f"turn {turn.id} ended {turn.status}")
            received: list[Any] = []
            for process in spawned:
                out, _ = process.communicate(timeout=RUN_TIMEOUT_S)
                if process.returncode != 0:
                    raise RuntimeError(f"a follower process exited with {process.returncode}")
                received += json.loads(out.strip().splitlines()[-1])["events"]
            elapsed = time.monotonic() - started
            cpu_after = server_process.cpu_times()
            sampler.stop()
            results["server_rss_peak_bytes"] = sampler.peak_rss
            results["server_threads_peak"] = sampler.peak_threads
            results["server_cpu_s"] = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
            results["streaming_s"] = elapsed
            results["load_average_after"] = os.getloadavg()[0]
        finally:
            for process in spawned:
                if process.poll() is None:
                    process.kill()
                    process.wait(10)
            server.stop()
            publisher.close()
            live.close()
            turn_store.close()
            engine.dispose()
            delete_redis_prefix(redis_url(), prefix)
    deltas_seen = [latency for kind, latency in received if kind == "MODEL_DELTA"]
    durable_seen = [latency for kind, latency in received if kind != "MODEL_DELTA"]
    expected_deltas = followers * turns * deltas
    if len(deltas_seen) != expected_deltas:
        raise RuntimeError(f"{len(deltas_seen)} deltas arrived, {expected_deltas} were sent to followers")
    results["events_received"] = len(received)
    results["all"] = latency_summary([latency for _, latency in received])
    results["deltas"] = latency_summary(deltas_seen)
    results["durable"] = latency_summary(durable_seen)
    results["server_cpu_ms_per_1000_events"] = results["server_cpu_s"] * 1000 / len(received) * 1000
    return results


def main() -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--followers", type=int, default=None, help="concurrent streams (default 200; 20 quick)")
        parser.add_argument("--processes", type=int, default=2, help="client processes the streams are spread over")
        parser.add_argument("--deltas", type=int, default=None, help="deltas per turn (default 40; 10 quick)")
        parser.add_argument("--interval", type=float, default=0.05, help="seconds between deltas")
        # Internal: the follower processes run this script again.
        parser.add_argument("--follow", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--url", default="", help=argparse.SUPPRESS)
        parser.add_argument("--conversation", default="", help=argparse.SUPPRESS)
        parser.add_argument("--streams", type=int, default=1, help=argparse.SUPPRESS)
        parser.add_argument("--turns", type=int, default=1, help=argparse.SUPPRESS)

    args = arguments(__doc__, extra)
    if args.follow:
        follow(args)
        return
    followers = args.followers if args.followers is not None else (20 if args.quick else 200)
    deltas = args.deltas if args.deltas is not None else (10 if args.quick else 40)
    turns = 1 if args.quick else 3
    log(f"SSE: {followers} followers of one conversation through agent-runner serve")
    results = {"machine": machine_facts(), **measure(followers, args.processes, turns, deltas, args.interval)}
    write_results(args.json, results)
    mb = 2**20
    log(
        f"  {results['events_received']} events received; latency p50 {results['all']['p50']:.1f} ms, "
        f"p99 {results['all']['p99']:.1f} ms (deltas p99 {results['deltas']['p99']:.1f} ms, durable p99 "
        f"{results['durable']['p99']:.1f} ms); server RSS {results['server_rss_idle_bytes'] / mb:.0f} MB idle, "
        f"{results['server_rss_peak_bytes'] / mb:.0f} MB peak; threads {results['server_threads_idle']} idle, "
        f"{results['server_threads_peak']} peak; server CPU {results['server_cpu_s']:.2f} s over "
        f"{results['streaming_s']:.1f} s"
    )


if __name__ == "__main__":
    main()
