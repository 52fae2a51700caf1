"""A same-origin front for a browser page: the built page at `/`, every `/v1/...` request passed on to the API server.

A chat page and its API usually share an origin (a reverse proxy in front of both); this
is that proxy, small. Responses are passed on as they arrive, so a stream stays a stream.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from tests.helpers.http_server import serving

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


class _Handler(SimpleHTTPRequestHandler):
    upstream: tuple[str, int]

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        if self.path.startswith("/v1/"):
            self._pass_on()
        else:
            super().do_GET()

    def do_POST(self) -> None:
        self._pass_on()

    def _pass_on(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        connection = http.client.HTTPConnection(*self.upstream, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        connection.request(self.command, self.path, body=body, headers=headers)
        answer = connection.getresponse()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        while True:
            chunk = answer.read1(65536)
            if not chunk:
                break
            self.wfile.write(chunk)
            self.wfile.flush()
        connection.close()
        self.close_connection = True


@contextmanager
def serve_page(folder: Path, api_url: str) -> Iterator[str]:
    """Serve `folder` and pass `/v1/...` on to `api_url`; yields the front's URL."""
    target = urlsplit(api_url)
    handler = type("PageHandler", (_Handler,), {"upstream": (target.hostname or "127.0.0.1", target.port or 80)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(folder)))
    with serving(server, "page-proxy") as url:
        yield url
