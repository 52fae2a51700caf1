"""A model server on 127.0.0.1 answering scripted replies in a provider's wire format, for the adapter and limit tests.

It answers each POST with the next scripted `Reply`, or, once the script is used up, with
`answer` (when given). With a `ProviderLimit` it behaves as a provider account does: past
its requests per window or its concurrent calls it answers 429 with `Retry-After`, and it
counts what it accepted and refused.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: a JSON body, or a list of SSE events when `sse` is set.

    An event is its data (JSON, or a string sent as is), or a `(name, data)` pair for a named event.
    """

    status: int = 200
    body: Any = None
    sse: list[Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    done: bool = True
    """Whether an SSE stream ends with `[DONE]`."""


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    """The JSON body; empty for a GET."""


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no idle keep-alive socket outlives a test.
    protocol_version = "HTTP/1.0"
    server: _HttpServer

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._answer(json.loads(raw) if raw else {})

    def do_GET(self) -> None:
        self._answer({})

    def _answer(self, body: dict[str, Any]) -> None:
        fake = self.server.fake
        reply = fake.take(RecordedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        try:
            if reply.delay:
                fake.stopping.wait(reply.delay)
            try:
                self._send(reply)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)
        finally:
            fake.finished(reply)

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.sse is not None:
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in [*reply.sse, "[DONE]"] if reply.done else reply.sse:
                # A (name, data) pair is sent with an `event:` line, as Anthropic and the Responses API do.
                name, data = event if isinstance(event, tuple) else (None, event)
                line = data if isinstance(data, str) else json.dumps(data)
                self.wfile.write((f"event: {name}\n" if name else "").encode() + f"data: {line}\n\n".encode())
                self.wfile.flush()
            return
        payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HttpServer(ThreadingHTTPServer):
    # Join handler threads on close so that no socket is left open after a test.
    daemon_threads = False
    block_on_close = True
    fake: FakeChatServer


@dataclass(frozen=True)
class ProviderLimit:
    """What the fake provider enforces: `requests` per sliding `window_s`, and `concurrency` calls at once."""

    requests: int | None = None
    window_s: float = 60.0
    concurrency: int | None = None


@dataclass
class ProviderCounts:
    """What a limited fake provider saw."""

    accepted: int = 0
    refused: int = 0
    most_in_flight: int = 0


class FakeChatServer:
    """Scripted chat-completions endpoint under `base_url`.

    Args:
        answer: The reply once the scripted ones are used up (default: a 418 saying so).
        limit: Refuse requests past it with 429 and `Retry-After`, as a provider does.
    """

    def __init__(
        self, answer: Callable[[RecordedRequest], Reply] | None = None, limit: ProviderLimit | None = None
    ) -> None:
        self.requests: list[RecordedRequest] = []
        self.stopping = threading.Event()
        self.limit = limit
        self.counts = ProviderCounts()
        self._answer = answer
        self._accepted_at: deque[float] = deque()
        self._in_flight = 0
        self._replies: list[Reply] = []
        self._lock = threading.Lock()
        self._httpd = _HttpServer(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        """The server without a path, for SDKs that add their API version themselves (Anthropic, Gemini)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def take(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            refusal = self._over_limit()
            if refusal is not None:
                self.counts.refused += 1
                return refusal
            self.counts.accepted += 1
            self._in_flight += 1
            self.counts.most_in_flight = max(self.counts.most_in_flight, self._in_flight)
            if self._replies:
                return self._replies.pop(0)
        if self._answer is not None:
            return self._answer(request)
        return Reply(418, {"error": {"message": "no scripted reply left", "type": "test_error"}})

    def finished(self, reply: Reply) -> None:
        """A reply was sent: an accepted call no longer counts as in flight."""
        if reply.status != 429:
            with self._lock:
                self._in_flight -= 1

    def _over_limit(self) -> Reply | None:
        if self.limit is None:
            return None
        now = time.monotonic()
        window = self.limit.window_s
        while self._accepted_at and self._accepted_at[0] <= now - window:
            self._accepted_at.popleft()
        wait: float | None = None
        if self.limit.requests is not None and len(self._accepted_at) >= self.limit.requests:
            wait = self._accepted_at[0] + window - now
        elif self.limit.concurrency is not None and self._in_flight >= self.limit.concurrency:
            wait = 0.5
        if wait is None:
            self._accepted_at.append(now)
            return None
        body = {"error": {"message": "Rate limit reached; try again later.", "type": "requests", "code": "rate_limit"}}
        return Reply(429, body, headers={"retry-after-ms": str(max(1, round(wait * 1000)))})

    def close(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def completion(
    content: str | None = None,
    tool_calls: list[tuple[str, str, str]] | None = None,
    usage: tuple[int, int] | None = (11, 7),
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in tool_calls
        ]
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"},
        ],
    }
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return body
