"""Memory: the resident set size of a process running an AgentWorker, before and after 5,000 turns.

The embedded default: SqlAgentTurnStore and SqlTurnLease on a SQLite file, one AgentWorker
thread, no chat memory. Turns of W(K=10) are started in batches through `runner.start`
(saved READY, the worker is woken) and the batch is awaited before the next one, so the
store's data lives in the database file and whatever stays in the process's memory is
the runner's, the worker's, the store's or the libraries'.

RSS is read with psutil after a warm-up (caches, statement compilation, pools) and a
garbage collection; again after the measured turns and a garbage collection; and along
the way, for the plot. Runs in its own process (`python bench/memory.py`), so nothing else
the benchmarks did is in its memory.

Run: `python bench/memory.py [--quick] [--json PATH] [--turns N]`.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from _common import arguments, log, w_agent, write_results

import store
from agent_runner import AgentEvent, AgentEventType, AgentRunner
from agent_runner.worker import AgentWorker

BATCH = 100


class Counter:
    """Counts completed turns; wakes the waiter when a target is reached."""

    def __init__(self) -> None:
        self.completed = 0
        self.other = 0
        self.condition = threading.Condition()

    def __call__(self, event: AgentEvent) -> None:
        if event.type.is_terminal:
            with self.condition:
                if event.type is AgentEventType.TURN_COMPLETED:
                    self.completed += 1
                else:
                    self.other += 1
                self.condition.notify_all()

    def wait_for(self, target: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        with self.condition:
            while self.completed + self.other < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{target - self.completed - self.other} turns still running")
                self.condition.wait(left)
            if self.other:
                raise RuntimeError(f"{self.other} turns did not complete")


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def measure(turns: int, warmup: int, folder: Path) -> dict[str, Any]:
    url = f"sqlite:///{folder / 'bench.db'}"
    engine = store.make_engine(url)
    runner = AgentRunner(turn_store=store.SqlAgentTurnStore(engine))
    counter = Counter()
    runner.add_event_listener(counter)
    worker = AgentWorker(runner, lease=store.SqlTurnLease(engine), concurrency=1, poll_interval=0.05)
    agent = w_agent(10)
    started_turns = 0

    def feed(count: int) -> None:
        nonlocal started_turns
        for _ in range(count):
            runner.start(agent, "check my orders")
        started_turns += count
        counter.wait_for(started_turns)

    worker.start()
    try:
        for _ in range(warmup // BATCH):
            feed(BATCH)
        before = rss()
        samples = [(0, before)]
        started = time.perf_counter()
        for index in range(turns // BATCH):
            feed(BATCH)
            if (index + 1) % 5 == 0:
                samples.append(((index + 1) * BATCH, rss()))
        elapsed = time.perf_counter() - started
        after = rss()
    finally:
        worker.stop()
        engine.dispose()
    result = {
        "store": "SqlAgentTurnStore + SqlTurnLease on a SQLite file (embedded default), one worker thread",
        "workload": "W K=10 (21 steps per turn)",
        "warmup_turns": warmup,
        "turns": turns // BATCH * BATCH,
        "rss_before_mb": before / 2**20,
        "rss_after_mb": after / 2**20,
        "growth_percent": (after - before) / before * 100,
        "samples": [(n, value / 2**20) for n, value in samples],
        "seconds": elapsed,
        "turns_per_s": turns / elapsed,
    }
    return result


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=None, help="measured turns (default 5,000; 1,000 with --quick)")


def main() -> None:
    args = arguments(__doc__, _extra)
    turns = args.turns or (1000 if args.quick else 5000)
    log(f"memory: {turns} turns on an AgentWorker (SQLite)")
    with tempfile.TemporaryDirectory(prefix="agent-runner-bench-") as folder:
        result = measure(turns, 200, Path(folder))
    write_results(args.json, result)
    print(
        f"RSS {result['rss_before_mb']:.1f} MB -> {result['rss_after_mb']:.1f} MB over {result['turns']} turns "
        f"({result['growth_percent']:+.1f}%); {result['turns_per_s']:.0f} turns/s"
    )


if __name__ == "__main__":
    main()
