"""Runs one embedded `AgentWorker` process for the integration tests, until SIGTERM.

Usage: `python -m tests.integration.embedded_worker.embedded_worker_main --database-url URL
[--lease sql|redis] [--agents module:attribute] [--setup module:function] ...`. Agents and
the runner set-up are named the way `AGENT_RUNNER_AGENT_LOADER` and `AGENT_RUNNER_SETUP`
name them for the Celery workers (default: the agents of `embedded_fleet`). The runner keeps
conversation turns' ChatMemory in the same database. It writes its pid to `--ready-file`
once the worker's threads are polling, and exits 0 after a clean stop (3 when a step was
still in flight after the stop timeout).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from agent_runner import AgentRunner
from agent_runner.persistence import TurnLease
from agent_runner.worker import AgentWorker
from store import SqlAgentTurnStore, SqlChatMemoryProvider, SqlTurnLease, make_engine
from tests.integration.embedded_worker import embedded_fleet
from workers.agents import apply_runner_setup, load_agent_loader

DEFAULT_AGENTS = f"{embedded_fleet.__name__}:loader"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--lease", choices=["sql", "redis"], default="sql")
    parser.add_argument("--redis-url")
    parser.add_argument("--redis-prefix")
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--poll-interval", type=float, default=0.05)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--ledger", type=Path)
    parser.add_argument("--step-log", type=Path)
    parser.add_argument("--agents", default=DEFAULT_AGENTS, help="module:attribute of the agents")
    parser.add_argument("--setup", help="module:function called with the runner (adds middleware, listeners)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    embedded_fleet.configure(args.ledger)

    engine = make_engine(args.database_url)
    turns = SqlAgentTurnStore(engine)
    lease: TurnLease
    if args.lease == "redis":
        from store import RedisTurnLease

        lease = redis_lease = RedisTurnLease(args.redis_url, prefix=args.redis_prefix)
    else:
        redis_lease = None
        lease = SqlTurnLease(engine)
    middleware = [embedded_fleet.StepLog(args.step_log)] if args.step_log else []
    runner = AgentRunner(
        turn_store=turns,
        agent_loader=load_agent_loader(args.agents),
        chat_memory_provider=SqlChatMemoryProvider(engine),
        middleware=middleware,
    )
    apply_runner_setup(runner, args.setup)
    worker = AgentWorker(
        runner,
        lease=lease,
        concurrency=args.concurrency,
        lease_ttl=args.lease_ttl,
        poll_interval=args.poll_interval,
    )
    try:
        worker.start()
        args.ready_file.write_text("ready", encoding="utf-8")
        while not stopping.wait(0.1):
            pass
        return 0 if worker.stop(timeout=10) else 3
    finally:
        if redis_lease is not None:
            redis_lease.close()
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
