"""Reading a durable event log in tests, where other writers may share the database server."""

from __future__ import annotations

import time
from collections.abc import Callable

from agent_runner import AgentEvent


def settled(read: Callable[[], list[AgentEvent]], count: int, within: float = 30.0) -> list[AgentEvent]:
    """Repeat `read` until it returns at least `count` events (or time runs out), and return the last result.

    On PostgreSQL a committed event becomes readable once every write transaction that
    started before it on the server has ended, and other suites may share the server.
    """
    deadline = time.monotonic() + within
    found = read()
    while len(found) < count and time.monotonic() < deadline:
        time.sleep(0.02)
        found = read()
    return found
