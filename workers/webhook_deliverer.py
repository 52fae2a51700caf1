"""Webhooks: signed HTTP POSTs to the app when a turn waits for a person, ends or fails.

Configured by the environment (read into `workers.settings.WebhookSettings`):

| variable | default | meaning |
|---|---|---|
| `AGENT_RUNNER_WEBHOOKS` | none | `kind=url` pairs separated by commas; kinds `waiting`, `ended`, `failed` |
| `AGENT_RUNNER_WEBHOOK_SECRET` | none (required with webhooks) | key of the HMAC-SHA256 signature |
| `AGENT_RUNNER_WEBHOOK_MAX_ATTEMPTS` | `8` | attempts of one delivery before it is dead-lettered |
| `AGENT_RUNNER_WEBHOOK_BACKOFF_S` | `2` | wait before the second attempt; doubles for each attempt after |
| `AGENT_RUNNER_WEBHOOK_MAX_BACKOFF_S` | `600` | longest wait between two attempts |
| `AGENT_RUNNER_WEBHOOK_TIMEOUT_S` | `5` | seconds one POST may take |
| `AGENT_RUNNER_WEBHOOK_INTERVAL_S` | `1` | seconds between two looks for due deliveries |
| `AGENT_RUNNER_WEBHOOK_LOOKBACK_S` | `3600` | how far back the very first look for events reaches |

Deliveries come from the durable event log through `store.webhooks.WebhookDeliveryLog`,
never from the step that saved the turn, so a webhook never delays a step and a crash
after a save loses none. Delivery is at least once: the delivery id (the event id) is the
same on every attempt, and receivers deduplicate on it. See docs/webhooks.md.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from workers.settings import WebhookSettings

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from store.webhooks import WebhookDelivery, WebhookDeliveryLog, WebhookKind

logger = logging.getLogger("workers.webhook_deliverer")

SIGNATURE_HEADER = "X-Agent-Runner-Signature"
"""`sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`, keyed by `AGENT_RUNNER_WEBHOOK_SECRET`."""
TIMESTAMP_HEADER = "X-Agent-Runner-Timestamp"
"""Unix seconds when the attempt was signed; part of the signed text, so a replay can be refused by age."""
DELIVERY_HEADER = "X-Agent-Runner-Delivery"
"""The delivery id (the event id): the same on every attempt; receivers deduplicate on it."""
KIND_HEADER = "X-Agent-Runner-Webhook"
"""The webhook kind: `waiting`, `ended` or `failed`."""

_LAG = timedelta(seconds=60)
"""How far before the newest delivered event the look for new events starts: a save commits
moments after its events are stamped, so one stamped earlier may become visible later."""

_RETRIED_CODES = frozenset({408, 425, 429})
"""4xx answers that mean "try again later"; any other 4xx is a refusal and dead-letters at once."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header value of `body` sent at `timestamp`: `sha256=` and the hex HMAC of `timestamp.body`."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


@dataclass(frozen=True)
class AttemptResult:
    """What one POST came to."""

    delivered: bool
    retry: bool
    """For a failure: whether a later attempt may succeed (5xx, 408, 429, timeout, no connection)."""
    status_code: int | None = None
    error: str | None = None


def post(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> AttemptResult:
    """POST `body` once; any 2xx answer is a delivery."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return AttemptResult(delivered=True, retry=False, status_code=response.status)
    except urllib.error.HTTPError as exc:
        retry = exc.code >= 500 or exc.code in _RETRIED_CODES
        return AttemptResult(delivered=False, retry=retry, status_code=exc.code, error=f"HTTP {exc.code}")
    except (OSError, http.client.HTTPException) as exc:  # timeouts, refused or dropped connections, bad answers
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return AttemptResult(delivered=False, retry=True, error=f"{type(reason).__name__}: {reason}")


class WebhookDeliverer:
    """Finds the events owed to webhooks and delivers them, retrying with backoff, until delivered or dead.

    `run_once()` does one round: the Celery task runs one per beat tick, the embedded
    processes one every `interval_s` (the `webhooks` row of `workers.sweeps.SWEEPS`).
    """

    def __init__(
        self,
        settings: WebhookSettings,
        log: WebhookDeliveryLog,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        send: Callable[[str, bytes, Mapping[str, str], float], AttemptResult] = post,
    ) -> None:
        self.settings = settings
        self.log = log
        self.clock = clock
        self.send = send

    @property
    def _urls(self) -> dict[WebhookKind, str]:
        from store.webhooks import WebhookKind

        return {WebhookKind(kind): url for kind, url in self.settings.urls.items()}

    def run_once(self, limit: int = 20) -> int:
        """Find new events, then make every due attempt (up to `limit`); return how many were delivered."""
        now = self.clock()
        self.log.discover(self._urls, now, lookback=timedelta(seconds=self.settings.lookback_s), lag=_LAG)
        # Hold a claimed row past the attempt's timeout, so no other process sends it meanwhile.
        hold = timedelta(seconds=self.settings.timeout_s * 2 + 5)
        delivered = 0
        for delivery in self.log.claim_due(now, hold, limit):
            delivered += self._attempt(delivery)
        return delivered

    def _attempt(self, delivery: WebhookDelivery) -> int:
        from store.webhooks import DeliveryStatus

        body = json.dumps(delivery.body, separators=(",", ":"), sort_keys=True).encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "agent-runner-webhooks",
            SIGNATURE_HEADER: sign(self.settings.secret, timestamp, body),
            TIMESTAMP_HEADER: timestamp,
            DELIVERY_HEADER: delivery.event_id,
            KIND_HEADER: delivery.kind.value,
        }
        result = self.send(delivery.url, body, headers, self.settings.timeout_s)
        now = self.clock()
        if result.delivered:
            self.log.record(delivery, DeliveryStatus.DELIVERED, now, status_code=result.status_code)
            return 1
        if result.retry and delivery.attempts < self.settings.max_attempts:
            retry_at = now + self.settings.backoff(delivery.attempts)
            self.log.record(
                delivery,
                DeliveryStatus.PENDING,
                now,
                next_attempt_at=retry_at,
                error=result.error,
                status_code=result.status_code,
            )
            return 0
        logger.warning(
            "webhook %s of event %s to %s dead after %d attempt(s): %s",
            delivery.kind.value,
            delivery.event_id,
            delivery.url,
            delivery.attempts,
            result.error,
        )
        self.log.record(delivery, DeliveryStatus.DEAD, now, error=result.error, status_code=result.status_code)
        return 0


def build_deliverer(settings: WebhookSettings | None, engine: Engine) -> WebhookDeliverer | None:
    """A deliverer over the store at `engine`; None when no webhook is configured."""
    if settings is None:
        return None
    from store.webhooks import WebhookDeliveryLog

    return WebhookDeliverer(settings, WebhookDeliveryLog(engine))
