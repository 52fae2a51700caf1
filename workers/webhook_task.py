"""The Celery task that delivers webhooks: beat sends it every `AGENT_RUNNER_WEBHOOK_INTERVAL_S`.

Retries and backoff live in the delivery log (`store.webhooks`), not in Celery: a failed
attempt is rescheduled there with its backoff, so it survives a worker restart, and the
task itself only does the attempts that are due, bounded in number, so a slow receiver
holds a worker slot for a few timeouts at most.
"""

from __future__ import annotations

import os
import threading

from workers.app import app
from workers.names import DELIVER_WEBHOOKS
from workers.webhooks import WebhookDeliverer, build_deliverer
from workers.wiring import current

_deliverers: dict[int, WebhookDeliverer] = {}
_lock = threading.Lock()

DELIVERIES_PER_TASK = 20
"""Attempts one task makes at most; the next tick takes the rest."""


def _deliverer() -> WebhookDeliverer | None:
    wiring = current()
    if wiring.settings.webhooks is None:
        return None
    # One per process: the delivery log remembers how far it has looked (a fork starts afresh).
    with _lock:
        found = _deliverers.get(os.getpid())
        if found is None:
            found = build_deliverer(wiring.settings.webhooks, wiring.engine)
            assert found is not None  # webhooks are configured
            _deliverers[os.getpid()] = found
        return found


def deliver_webhooks() -> int:
    """Find new events owed to webhooks and make the due attempts; return how many were delivered."""
    deliverer = _deliverer()
    return 0 if deliverer is None else deliverer.run_once(DELIVERIES_PER_TASK)


deliver_webhooks_task = app.task(name=DELIVER_WEBHOOKS, ignore_result=True)(deliver_webhooks)
