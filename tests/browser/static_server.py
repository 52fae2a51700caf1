"""A tiny HTTP server for the console's unit-style browser tests.

It serves the console's static folder at /static (and its generated contract module, as the
server does), the test pages at /, plus scripted
`text/event-stream` endpoints at /sse/<name> for the stream client: each stream is a fixed
list of events that become due one after the other from the first request on (like a live
server, a reconnect gets what it missed and then what comes next), and every request's
Authorization and Last-Event-ID headers are recorded for the test to check.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.helpers.http_server import serving
from workers.api.contract import CONTRACT_PATH, console_contract

STATIC = Path(__file__).resolve().parents[2] / "workers" / "api" / "static"
PAGES = Path(__file__).resolve().parent / "pages"


@dataclass
class ScriptedStream:
    """Events (`id`, `type`, `data`) sent `interval` seconds apart; `drop_after` ids end the first connection early."""

    events: list[dict[str, Any]]
    interval: float = 0.15
    drop_after: set[str] = field(default_factory=set)
    end: bool = True
    requests: list[dict[str, str | None]] = field(default_factory=list)
    started: float | None = None
    dropped: set[str] = field(default_factory=set)


class StreamRegistry:
    """The scripted streams of one server, by name."""

    def __init__(self) -> None:
        self.streams: dict[str, ScriptedStream] = {}
        self.lock = threading.Lock()

    def add(self, name: str, stream: ScriptedStream) -> ScriptedStream:
        with self.lock:
            self.streams[name] = stream
        return stream


def delta_stream(
    text: str, *, turn_id: str = "t-1", message_id: str = "m-1", chunk: int = 5, **options: Any
) -> ScriptedStream:
    """MODEL_DELTA events spelling `text`, then MODEL_RESPONSE with the whole text and TURN_COMPLETED."""
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    events: list[dict[str, Any]] = []
    for piece in pieces:
        events.append({"type": "MODEL_DELTA", "turn_id": turn_id, "data": {"delta": piece}})
    events.append({"type": "MODEL_RESPONSE", "turn_id": turn_id, "data": {"message_id": message_id, "content": text}})
    events.append({"type": "TURN_COMPLETED", "turn_id": turn_id, "data": {}})
    for number, event in enumerate(events, start=1):
        event["id"] = f"c{number:04d}"
    return ScriptedStream(events=events, **options)


class _Handler(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript", ".mjs": "text/javascript"}
    registry: StreamRegistry

    def translate_path(self, path: str) -> str:
        clean = path.split("?", 1)[0].split("#", 1)[0]
        if clean.startswith("/static/"):
            return str(STATIC / clean.removeprefix("/static/"))
        return str(PAGES / clean.lstrip("/"))

    def do_GET(self) -> None:
        if self.path.startswith("/sse/"):
            self._stream(self.path.removeprefix("/sse/").split("?", 1)[0])
        elif self.path.split("?", 1)[0] == CONTRACT_PATH:
            body = console_contract().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/javascript")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            super().do_GET()

    def _stream(self, name: str) -> None:
        with self.registry.lock:
            stream = self.registry.streams.get(name)
            if stream is not None:
                stream.requests.append(
                    {
                        "authorization": self.headers.get("Authorization"),
                        "last_event_id": self.headers.get("Last-Event-ID"),
                    }
                )
                if stream.started is None:
                    stream.started = time.monotonic()
        if stream is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        ids = [e["id"] for e in stream.events]
        last = self.headers.get("Last-Event-ID")
        position = ids.index(last) + 1 if last in ids else 0
        assert stream.started is not None
        try:
            # Field order, a comment, CRLF endings and a two-line data field: all of what a parser must handle.
            self.wfile.write(b": stream open\r\n\r\nretry: 200\r\n\r\n")
            self.wfile.flush()
            for index in range(position, len(stream.events)):
                due = stream.started + (index + 1) * stream.interval
                time.sleep(max(0.0, due - time.monotonic()))
                event = stream.events[index]
                head, _, tail = json.dumps(event).partition(", ")
                chunk = f"id: {event['id']}\r\nevent: {event['type']}\r\ndata: {head},\ndata:{tail}\n\n"
                # Split the bytes so one event arrives in two reads.
                raw = chunk.encode()
                self.wfile.write(raw[:7])
                self.wfile.flush()
                self.wfile.write(raw[7:])
                self.wfile.flush()
                if event["id"] in stream.drop_after and event["id"] not in stream.dropped:
                    stream.dropped.add(event["id"])
                    return
            if stream.end:
                self.wfile.write(b"event: end\ndata: {}\n\n")
                self.wfile.flush()
            else:
                while True:
                    time.sleep(0.5)
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class StaticServer:
    url: str
    streams: StreamRegistry


@contextmanager
def serve_static() -> Iterator[StaticServer]:
    """Serve on a free loopback port until the block ends."""
    registry = StreamRegistry()
    handler = type("Handler", (_Handler,), {"registry": registry})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    with serving(server, "static-pages") as url:
        yield StaticServer(url=url, streams=registry)
