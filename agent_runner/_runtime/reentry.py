"""Which turns the calling thread is stepping, so that nested calls continue a turn only once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agent_runner._runtime.context import RunnerContext


@contextmanager
def driving(ctx: RunnerContext, turn_id: str) -> Iterator[None]:
    """Mark `turn_id` as being stepped by this thread for the duration of the block."""
    marked: set[str] | None = getattr(ctx.local, "driving", None)
    if marked is None:
        marked = ctx.local.driving = set()
    added = turn_id not in marked
    marked.add(turn_id)
    try:
        yield
    finally:
        if added:
            marked.discard(turn_id)


def is_driving(ctx: RunnerContext, turn_id: str) -> bool:
    """Whether this thread is stepping `turn_id` (a child that ends then tells its parent itself)."""
    marked: set[str] | None = getattr(ctx.local, "driving", None)
    return bool(marked) and turn_id in marked  # type: ignore[operator]
