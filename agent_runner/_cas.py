"""One compare-and-swap retry loop for the runner's read-modify-write operations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from agent_runner.errors import VersionConflictError

T = TypeVar("T")

ATTEMPTS: Final = 20
"""How often an operation re-reads and retries after losing a compare-and-swap race."""


class _Again:
    """Returned by an attempt to ask for another one (the state moved on under it)."""

    def __repr__(self) -> str:
        return "AGAIN"


AGAIN: Final = _Again()


def retry_on_conflict(turn_id: str, attempt: Callable[[], T | _Again]) -> T:
    """Call `attempt` until it returns a result, re-running it after a lost race.

    `attempt` reads the current state itself, so each run decides afresh: a concurrent
    change is never overwritten, it is re-validated. It returns `AGAIN` (or raises
    `VersionConflictError`) to be run once more.

    Raises:
        VersionConflictError: `ATTEMPTS` attempts in a row lost their race.
    """
    for _ in range(ATTEMPTS):
        try:
            result = attempt()
        except VersionConflictError:
            continue
        if not isinstance(result, _Again):
            return result
    raise VersionConflictError(turn_id, -1, None)
