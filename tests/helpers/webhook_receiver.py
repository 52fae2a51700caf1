"""A webhook receiver for tests: an HTTP server on 127.0.0.1 that records every POST and checks its signature.

Its answer to each request comes from `answer` (200 unless told otherwise): the webhook
tests make it fail some deliveries to watch the retries and the dead letters.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.helpers.http_server import serving


@dataclass(frozen=True)
class Received:
    """One POST the receiver got, and what it answered."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def payload(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.body)
        return loaded

    @property
    def delivery_id(self) -> str:
        return self.headers["x-agent-runner-delivery"]

    def signature_is_valid(self, secret: str) -> bool:
        """Check the signature the way docs/webhooks.md tells receivers to."""
        timestamp = self.headers["x-agent-runner-timestamp"]
        expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(f"sha256={expected}", self.headers["x-agent-runner-signature"])


@dataclass
class WebhookReceiver:
    """The recorded requests, and the function choosing each answer."""

    url: str = ""
    answer: Callable[[str, dict[str, Any], list[Received]], int] = lambda path, payload, earlier: 200
    """`(path, payload, the earlier requests of the same delivery) -> HTTP status`."""
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of_turn(self, turn_id: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.payload["event"]["turn_id"] == turn_id]

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout}s waiting for {what}; received: {self.summary()}")
            time.sleep(0.05)

    def summary(self) -> list[tuple[str, str, str, int]]:
        with self.lock:
            return [
                (r.path, r.payload["event"]["turn_id"], r.payload["event"]["type"], r.status) for r in self.received
            ]


def fail_by_conversation(path: str, payload: dict[str, Any], earlier: list[Received]) -> int:
    """An `answer`: deliveries of `flaky-*` conversations fail once (500), those of `dead-*` ones always."""
    conversation = payload["event"]["conversation_id"] or ""
    if conversation.startswith("dead-"):
        return 500
    if conversation.startswith("flaky-") and not earlier:
        return 500
    return 200


@contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    """Run a receiver on a free port of 127.0.0.1 until the block ends."""
    receiver = WebhookReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            payload = json.loads(body)
            with receiver.lock:
                earlier = [r for r in receiver.received if r.payload["delivery_id"] == payload["delivery_id"]]
            status = receiver.answer(self.path, payload, earlier)
            headers = {k.lower(): v for k, v in self.headers.items()}
            with receiver.lock:
                receiver.received.append(Received(self.path, headers, body, status))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler), "webhook-receiver") as url:
        receiver.url = url
        yield receiver


def webhook_env(receiver: WebhookReceiver, secret: str, **overrides: str) -> dict[str, str]:
    """The environment that sends every kind of webhook to `receiver` (`/<kind>`), retrying fast."""
    kinds = ("waiting", "ended", "failed")
    env = {
        "AGENT_RUNNER_WEBHOOKS": ",".join(f"{kind}={receiver.url}/{kind}" for kind in kinds),
        "AGENT_RUNNER_WEBHOOK_SECRET": secret,
        "AGENT_RUNNER_WEBHOOK_MAX_ATTEMPTS": "3",
        "AGENT_RUNNER_WEBHOOK_BACKOFF_S": "0.1",
        "AGENT_RUNNER_WEBHOOK_TIMEOUT_S": "3",
        "AGENT_RUNNER_WEBHOOK_INTERVAL_S": "0.1",
    }
    env.update(overrides)
    return env
