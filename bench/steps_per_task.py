"""How many steps one `step_turn` task should run under one lease (`AGENT_RUNNER_STEPS_PER_TASK`).

A task that runs more steps saves the broker round trip, the lease acquisition and the
snapshot load between steps; a task that runs fewer lets other turns take the worker in
between, so one long turn cannot hold a pool process while short ones wait in the queue.
This measures both sides with real worker processes, PostgreSQL and Redis:

1. Overhead: 24 turns of 41 steps each with an instant scripted model, for each candidate
   value; the time per step, and the extra cost of a task hop per step against the largest
   value (which runs a whole turn in one task).
2. Fairness: 8 long turns (60 steps, 20 ms per model call) start first, filling the pool
   of 4 processes; 16 short turns (3 steps) arrive 0.2 s later. The short turns' wait is
   what a user of a busy deployment feels.

Run with the services up: `python bench/steps_per_task.py` (uses the test database and
Redis of `AGENT_RUNNER_TEST_DATABASE_URL` / `AGENT_RUNNER_TEST_REDIS_URL` under a private
schema and key prefix, removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _common import stop_process_group
from redis import Redis

import store
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
from workers.producer import build_runner
from workers.settings import WorkerSettings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@tool
def noop(index: int) -> str:
    """Do nothing (the cost under test is the runner's and the queue's, not the tool's)."""
    return f"ok {index}"


class BenchModel:
    """Asks for `rounds` tool calls, one per response, then answers; sleeps `delay` per call."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Next tool call, or the final answer."""
        start = max(i for i, m in enumerate(request.messages) if isinstance(m, UserMessage))
        spec = json.loads(request.messages[start].content)
        time.sleep(spec["delay"])
        done = sum(1 for m in request.messages[start:] if isinstance(m, ToolMessage))
        if done < spec["rounds"]:
            call = ToolCall(id=f"c{done}-{uuid.uuid4().hex[:6]}", name="noop", arguments={"index": done})
            return ChatResponse(message=AiMessage(tool_calls=[call]))
        return ChatResponse(message=AiMessage(content="done"))


def build_loader() -> InMemoryAgentLoader:
    """`AGENT_RUNNER_AGENT_LOADER=steps_per_task:build_loader` for the worker processes."""
    return InMemoryAgentLoader([Agent(id="bench", chat_model=BenchModel(), tools=[noop], max_iterations=500)])


def _env(database_url: str, redis_url: str, prefix: str, steps_per_task: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_RUNNER_", "CELERY_"))}
    env.update(
        {
            "AGENT_RUNNER_DATABASE_URL": database_url,
            "AGENT_RUNNER_REDIS_URL": redis_url,
            "AGENT_RUNNER_REDIS_PREFIX": prefix,
            "AGENT_RUNNER_BROKER_KEY_PREFIX": f"{prefix}:broker:",
            "AGENT_RUNNER_QUEUE": f"{prefix}-queue",
            "AGENT_RUNNER_AGENT_LOADER": "steps_per_task:build_loader",
            "AGENT_RUNNER_STEPS_PER_TASK": str(steps_per_task),
            "AGENT_RUNNER_MAX_STEPS": "1000",
            "PYTHONPATH": str(HERE),
        }
    )
    return env


def _start_worker(env: dict[str, str], concurrency: int, log: Path) -> subprocess.Popen[bytes]:
    celery = str(Path(sys.executable).with_name("celery"))
    args = [celery, "-A", "workers.app", "worker", "--pool=prefork", f"--concurrency={concurrency}"]
    args += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING"]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    return process


def _wait_all(runner: Any, turn_ids: list[str], timeout: float) -> dict[str, float]:
    """Wait until every turn ended; return when each was first seen ended (monotonic)."""
    ended: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(ended) < len(turn_ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(turn_ids) - len(ended)} turns still running after {timeout}s")
        for turn_id in turn_ids:
            if turn_id not in ended and runner.turn_store.load(turn_id).is_terminal:
                ended[turn_id] = time.monotonic()
        time.sleep(0.01)
    return ended


def _measure(database_url: str, redis_url: str, steps_per_task: int, concurrency: int, tmp: Path) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(database_url)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = sa.make_url(database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    schema_url = url.render_as_string(hide_password=False)
    store.migrate(schema_url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    env = _env(schema_url, redis_url, prefix, steps_per_task)
    worker = _start_worker(env, concurrency, tmp / f"worker-{steps_per_task}.log")
    try:
        runner = build_runner(WorkerSettings.from_env(env))
        # Warm up: the pool processes build their wiring on their first task.
        warm = [runner.start("bench", json.dumps({"rounds": 1, "delay": 0})).id for _ in range(concurrency * 2)]
        _wait_all(runner, warm, 60)

        begin = time.monotonic()
        turns = [runner.start("bench", json.dumps({"rounds": 20, "delay": 0})).id for _ in range(24)]
        _wait_all(runner, turns, 300)
        elapsed = time.monotonic() - begin
        steps = sum(runner.turn_store.load(t).steps for t in turns)

        long_turns = [runner.start("bench", json.dumps({"rounds": 30, "delay": 0.02})).id for _ in range(8)]
        time.sleep(0.2)
        arrived = time.monotonic()
        short_turns = [runner.start("bench", json.dumps({"rounds": 1, "delay": 0.02})).id for _ in range(16)]
        ended = _wait_all(runner, long_turns + short_turns, 300)
        waits = sorted(ended[t] - arrived for t in short_turns)
        return {
            "ms_per_step": 1000 * elapsed / steps,
            "short_p50_s": statistics.median(waits),
            "short_max_s": waits[-1],
            "long_done_s": max(ended[t] for t in long_turns) - arrived,
        }
    finally:
        stop_process_group(worker)
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
        client: Redis[Any] = Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


def main() -> None:
    """Measure each candidate value and print a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", default="1,2,4,8,16,32,1000")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    database_url = os.environ.get("AGENT_RUNNER_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    redis_url = os.environ.get("AGENT_RUNNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    rows = []
    for value in (int(v) for v in args.values.split(",")):
        rows.append((value, _measure(database_url, redis_url, value, args.concurrency, tmp)))
    baseline = rows[-1][1]["ms_per_step"]
    print(f"pool of {args.concurrency} prefork processes, PostgreSQL + Redis broker on one machine")
    print("steps/task  ms/step  hop cost/step  short p50  short max  long turns done")
    for value, row in rows:
        hop = row["ms_per_step"] - baseline
        print(
            f"{value:>10}  {row['ms_per_step']:7.2f}  {hop:10.2f} ms  {row['short_p50_s']:7.2f} s  "
            f"{row['short_max_s']:7.2f} s  {row['long_done_s']:9.2f} s"
        )


if __name__ == "__main__":
    main()
