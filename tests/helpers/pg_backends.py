"""PostgreSQL backends whose statements wait on a lock: found, and killed, for the tests of dropped connections."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")


def waiting_backends(
    admin: psycopg.Connection[tuple[Any, ...]], query_prefix: str, count: int, what: str, *, blocked_by: int | None
) -> list[int]:
    """Wait until `count` backends run a statement starting with `query_prefix` that waits on a lock; their pids.

    With `blocked_by`, only statements that the backend `blocked_by` holds up count, which
    keeps the search off other tests' statements on a shared server.
    """
    found: list[int] = []
    for _ in range(500):
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
            " AND (%s::int IS NULL OR %s::int = ANY(pg_blocking_pids(pid))) ORDER BY pid",
            [query_prefix + "%", blocked_by, blocked_by],
        ).fetchall()
        found = [int(row[0]) for row in rows]
        if len(found) >= count:
            return found
        time.sleep(0.01)
    raise AssertionError(f"the {what} never reached the server ({len(found)} of {count} waiting)")


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
    wait on a lock another transaction holds (see `waiting_backends` for `blocked_by`); its
    backend is terminated while it waits, and the outcome (the value returned or the
    exception raised) is returned once the thread ended.
    """
    outcome: list[BaseException | T] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:  # the caller checks it
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    [waiting] = waiting_backends(admin, query_prefix, 1, what, blocked_by=blocked_by)[:1]
    admin.execute("SELECT pg_terminate_backend(%s)", [waiting])
    worker.join(timeout=30)
    return outcome
