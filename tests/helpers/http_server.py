"""Small HTTP servers of the tests (pages, receivers, fakes), each on a free loopback port of its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import HTTPServer


@contextmanager
def serving(server: HTTPServer, name: str = "test-http-server") -> Iterator[str]:
    """Serve `server` from a thread until the block ends; yields its URL (`http://127.0.0.1:<port>`)."""
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
