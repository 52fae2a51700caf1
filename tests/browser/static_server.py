"""A tiny HTTP server for the renderer tests: the console's static folder at /static, test pages at /."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STATIC = Path(__file__).resolve().parents[2] / "workers" / "api" / "static"
PAGES = Path(__file__).resolve().parent / "pages"


class _Handler(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript", ".mjs": "text/javascript"}

    def translate_path(self, path: str) -> str:
        clean = path.split("?", 1)[0].split("#", 1)[0]
        if clean.startswith("/static/"):
            return str(STATIC / clean.removeprefix("/static/"))
        return str(PAGES / clean.lstrip("/"))

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve_static() -> Iterator[str]:
    """Serve on a free loopback port; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
