"""The infrastructure alone: a Celery chain of no-op tasks, each re-enqueueing the next.

It runs on the same broker with the same settings as the runner's own app: the Celery
configuration is `workers.celery_app.config.celery_config` applied to a separate app (JSON only,
`task_acks_late`, reject on worker lost, prefetch 1, no result backend), from the same
environment variables, on its own queue. A hop does nothing but send the next hop; the
last hop of a chain pushes the chain id onto a Redis list the benchmark watches.

Started by `celery_bench.py` as `celery -A raw_chain worker` (with `bench/` on PYTHONPATH).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from workers.celery_app.config import celery_config
from workers.settings import WorkerSettings

settings = WorkerSettings.from_env()
app = Celery("bench_raw_chain")
app.conf.update(celery_config(settings))
app.conf.beat_schedule = {}

HOP = "bench.raw_chain.hop"
_client: tuple[int, Any] | None = None


def done_key() -> str:
    return f"{settings.redis_prefix}:raw-chain-done"


def _redis() -> Any:
    # One client per process, made after the prefork pool forked.
    global _client
    if _client is None or _client[0] != os.getpid():
        from redis import Redis

        _client = (os.getpid(), Redis.from_url(settings.redis_url))
    return _client[1]


def _hop(chain_id: str, remaining: int) -> None:
    if remaining > 0:
        app.send_task(HOP, args=(chain_id, remaining - 1), queue=settings.queue)
    else:
        _redis().rpush(done_key(), chain_id)


hop = app.task(name=HOP, ignore_result=True)(_hop)
