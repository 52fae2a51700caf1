"""An OTLP/HTTP trace receiver for the tests: the worker processes export to it, it writes JSON lines.

It speaks the collector's protocol (`POST /v1/traces`, protobuf `ExportTraceServiceRequest`,
optionally gzip-compressed) on 127.0.0.1, so the workers run their real exporter as
configured by the standard OTEL_* variables. Each span becomes one JSON object per line in
`path`: ids in hex, the service name, attributes, status, events and links.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.helpers.http_server import serving


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items if isinstance(item, KeyValue)}


def spans_of(request: ExportTraceServiceRequest) -> Iterator[dict[str, Any]]:
    """The spans of one export request as plain JSON-ready dicts."""
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "service": resource.get("service.name"),
                    "resource_pid": resource.get("process.pid"),
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex() or None,
                    "name": span.name,
                    "kind": span.kind,
                    "attributes": _attributes(span.attributes),
                    "status": span.status.code,
                    "events": [event.name for event in span.events],
                    "links": [
                        {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(), **_attributes(link.attributes)}
                        for link in span.links
                    ],
                    "start": span.start_time_unix_nano,
                }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = [json.dumps(span) + "\n" for span in spans_of(request)]
        with self.server.lock, self.server.path.open("a") as sink:
            sink.writelines(lines)
        payload = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, path: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.path = path
        self.lock = threading.Lock()


@contextmanager
def otlp_receiver(path: Path) -> Iterator[str]:
    """Serve OTLP/HTTP on a free loopback port while the block runs; yields the endpoint URL."""
    path.touch()
    with serving(_Server(path), "otlp-receiver") as url:
        yield url


def read_spans(path: Path) -> list[dict[str, Any]]:
    """Every span received so far."""
    with path.open() as source:
        return [json.loads(line) for line in source if line.strip()]
