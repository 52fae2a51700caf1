"""HTTP API: POST /v1/turns requests/s and latency with 16 concurrent clients, against a bare FastAPI INSERT.

Both servers run in the same run, on the same PostgreSQL server, under uvicorn with one
process each:

- `agent-runner serve --worker celery`: POST /v1/turns validates the request, checks the
  agent, saves the READY turn and its first message, enqueues its first step on the Redis
  broker (as for Celery workers) and answers with the turn view. No worker consumes the
  queue, so only the API's own cost is measured: saved and enqueued;
- a bare FastAPI app whose POST validates the same body with pydantic and does one INSERT.

Each repetition sends requests from 16 client threads (keep-alive connections) for a
fixed time, first to one server, then to the other; the figures are medians over the
repetitions, and the ratio is taken within each repetition. The clients share the
machine with the servers, so absolute numbers depend on it; the ratio is the result.

    python bench/api_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from _common import (
    ROOT,
    Stat,
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
from pydantic import BaseModel, ConfigDict


class Item(BaseModel):
    """The baseline's request body: the same fields as a turn start, validated as strictly."""

    model_config = ConfigDict(extra="forbid", strict=True)
    agent_id: str
    input: str


CLIENTS = 16
AGENT_RUNNER = str(Path(sys.executable).with_name("agent-runner"))


def bare_app(database_url: str) -> Any:
    """The baseline: pydantic validation of the same body and one INSERT per request."""
    import sqlalchemy as sa
    from fastapi import FastAPI

    import store

    engine = store.make_engine(database_url)
    metadata = sa.MetaData()
    items = sa.Table(
        "bench_items",
        metadata,
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("agent_id", sa.String, nullable=False),
        sa.Column("input", sa.Text, nullable=False),
    )
    metadata.create_all(engine)

    app = FastAPI()

    @app.post("/items", status_code=201)
    def create(item: Item) -> dict[str, str]:
        item_id = uuid.uuid4().hex
        with engine.begin() as connection:
            connection.execute(sa.insert(items).values(id=item_id, agent_id=item.agent_id, input=item.input))
        return {"id": item_id, "agent_id": item.agent_id, "status": "READY"}

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(command: list[str], env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{command[:3]} did not start")
        time.sleep(0.1)


def queued_messages(prefix: str) -> int:
    """Messages waiting in the run's Celery queue (each answered POST enqueued one)."""
    from redis import Redis

    client: Any = Redis.from_url(redis_url())
    try:
        return sum(int(client.llen(key)) for key in client.scan_iter(match=f"{prefix}:broker:{prefix}-queue*"))
    finally:
        client.close()


def load(url: str, path: str, body: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Send POSTs from `CLIENTS` threads for `seconds`; requests/s and latency of the 2xx answers."""
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    failures = [0] * CLIENTS
    begin = time.perf_counter() + 0.2  # every client connected before the clock starts
    end = begin + seconds

    def client(index: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            http.get("/healthz")
            while time.perf_counter() < begin:
                time.sleep(0.001)
            while time.perf_counter() < end:
                sent = time.perf_counter()
                response = http.post(path, json=body)
                if 200 <= response.status_code < 300:
                    latencies[index].append(time.perf_counter() - sent)
                else:
                    failures[index] += 1
                    if failures[index] == 1:
                        log(f"{path}: {response.status_code} {response.text[:300]}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = [value for values in latencies for value in values]
    return {"requests_per_s": len(done) / seconds, "failures": sum(failures), **latency_summary(done)}


def main() -> int:
    args = arguments(__doc__)
    seconds = 3.0 if args.quick else 8.0
    repetitions = 2 if args.quick else 3
    body = {"agent_id": "desk", "input": "hello"}
    results: dict[str, Any] = {"machine": machine_facts(), "clients": CLIENTS, "seconds_per_run": seconds}
    prefix = f"bench-api-{uuid.uuid4().hex[:8]}"
    with pg_schema("apibench") as (database_url, _schema):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_RUNNER_", "CELERY_"))}
        env["AGENT_RUNNER_DATABASE_URL"] = database_url
        # The Redis broker and keys of this run alone (deleted afterwards): the steps are enqueued there.
        env["AGENT_RUNNER_REDIS_URL"] = env["CELERY_BROKER_URL"] = redis_url()
        env["AGENT_RUNNER_REDIS_PREFIX"] = prefix
        env["AGENT_RUNNER_BROKER_KEY_PREFIX"] = f"{prefix}:broker:"
        env["AGENT_RUNNER_QUEUE"] = f"{prefix}-queue"
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "bench")])
        api_port, bare_port = free_port(), free_port()
        api = start(
            [
                AGENT_RUNNER,
                "serve",
                "--agents",
                "tests.integration.api.api_agents:build_loader",
                "--port",
                str(api_port),
                "--worker",
                "celery",
            ],
            env,
            api_port,
        )
        bare = start([sys.executable, __file__, "--serve-bare", str(bare_port), database_url], env, bare_port)
        runs: list[dict[str, Any]] = []
        try:
            for repetition in range(repetitions):
                api_run = load(f"http://127.0.0.1:{api_port}", "/v1/turns", body, seconds)
                bare_run = load(f"http://127.0.0.1:{bare_port}", "/items", body, seconds)
                ratio = api_run["requests_per_s"] / bare_run["requests_per_s"]
                log(
                    f"run {repetition + 1}: POST /v1/turns {api_run['requests_per_s']:.0f}/s "
                    f"(p50 {api_run['p50']:.1f} ms, p99 {api_run['p99']:.1f} ms); bare INSERT "
                    f"{bare_run['requests_per_s']:.0f}/s (p50 {bare_run['p50']:.1f} ms, p99 {bare_run['p99']:.1f} ms); "
                    f"ratio {ratio:.2f}"
                )
                runs.append({"api": api_run, "bare": bare_run, "ratio": ratio})
            results["enqueued"] = queued_messages(prefix)
        finally:
            stop_process_group(api)
            stop_process_group(bare)
            delete_redis_prefix(redis_url(), prefix)
    for name in ("api", "bare"):
        results[name] = {
            key: Stat.of([run[name][key] for run in runs]).as_dict() for key in ("requests_per_s", "p50", "p99")
        }
        results[name]["failures"] = sum(run[name]["failures"] for run in runs)
    results["ratio_requests_per_s"] = Stat.of([run["ratio"] for run in runs]).as_dict()
    results["answered"] = sum(run["api"]["n"] for run in runs)
    log(
        f"POST /v1/turns: {results['api']['requests_per_s']['median']:.0f} requests/s, "
        f"p50 {results['api']['p50']['median']:.1f} ms, p99 {results['api']['p99']['median']:.1f} ms; "
        f"{statistics.median(run['ratio'] for run in runs):.2f}x the requests/s of a bare FastAPI INSERT"
    )
    write_results(args.json, results)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-bare":
        import uvicorn

        uvicorn.run(bare_app(sys.argv[3]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
        sys.exit(0)
    sys.exit(main())
