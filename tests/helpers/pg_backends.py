"""Killing a PostgreSQL backend while one of its statements waits on a lock, for the tests of dropped connections."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")


def killed_while_waiting(
    admin: psycopg.Connection[tuple[Any, ...]],
    action: Callable[[], T],
    query_prefix: str,
    what: str,
    *,
    blocked_by: int | None = None,
) -> list[BaseException | T]:
    """Run `action` on a thread, terminate the backend whose statement waits on a lock, and return its outcome.

    The statement that `action` sends (its text starts with `query_prefix`) must be made to
    wait on a lock another transaction holds (the backend `blocked_by`, when given, which
    keeps the search off other tests' statements on a shared server); its backend is
    terminated while it waits, and the outcome (the value returned or the exception
    raised) is returned once the thread ended.
    """
    outcome: list[BaseException | T] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:  # the caller checks it
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    waiting = None
    for _ in range(500):
        waiting = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
            " AND (%s::int IS NULL OR %s::int = ANY(pg_blocking_pids(pid)))",
            [query_prefix + "%", blocked_by, blocked_by],
        ).fetchone()
        if waiting is not None:
            break
        time.sleep(0.01)
    assert waiting is not None, f"the {what} never reached the server"
    admin.execute("SELECT pg_terminate_backend(%s)", [waiting[0]])
    worker.join(timeout=30)
    return outcome
