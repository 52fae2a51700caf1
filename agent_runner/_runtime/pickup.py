"""Where a step starts from: the snapshot the store keeps at hand, when it is safe to skip the load.

A load is a round trip to the store. A store that implements `CachedSnapshots` hands back
the snapshot of its own last save or read instead, and the runner uses it only where a
stale one costs no wrong work:

- a resume validates its command against it and saves by compare-and-swap: a turn that
  moved on since refuses the save, and the resume loads and decides again (so does a
  command the cached snapshot does not fit, which may fit the stored one);
- a holder that has just taken a turn's lease steps from it only when it is the version
  the dispatch or the poll reported moments ago (`FRESH_S`), it is runnable, and the new
  fence directly follows the fence it was saved under. Every step is saved under a lease,
  so no step was saved since. A change saved without the lease through another store
  object is found by the step's first save: the compare-and-swap refuses the changed
  version and the holder continues from the reloaded turn (`continue_after_stale`);
  nothing is done twice that must not be, as a tool that is not idempotent is marked
  started by a save before its body runs, and that save is refused. A cancel requested
  elsewhere keeps the version (it only flags a RUNNING turn), so only a load sees it
  before the step: hence the freshness bound, within which a load made then would have
  missed the flag just as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

from agent_runner.persistence import AgentTurnStore, CachedSnapshots
from agent_runner.results import AdvanceResult, StopReason
from agent_runner.snapshot import AgentTurn


def cached(store: AgentTurnStore, turn_id: str) -> AgentTurn | None:
    """The store's cached snapshot of the turn; None when it keeps none or cannot (no `CachedSnapshots`)."""
    return store.cached_snapshot(turn_id) if isinstance(store, CachedSnapshots) else None


FRESH_S = 0.1
"""How recently a turn must have been seen at a version for its cached snapshot to stand in for a load."""


class Sighting(NamedTuple):
    """A turn's version as a dispatch or a poll reported it, and when (`time.monotonic()`)."""

    version: int
    at: float


def seen_now(version: int) -> Sighting:
    """A sighting of `version` now."""
    return Sighting(version, time.monotonic())


def under_lease(
    store: AgentTurnStore, turn_id: str, seen: Sighting | None, fence: int | None, now: datetime
) -> tuple[AgentTurn, bool]:
    """The snapshot to step a turn from once its lease is taken with `fence`, and whether it is the cached one.

    `seen` is the version the caller saw the turn at and when (None: unknown). The cached
    snapshot is used when it is that version, seen within `FRESH_S`, it is runnable at
    `now`, and no other holder took the lease since it was saved (`fence` is its lease
    fence plus one); otherwise the turn is loaded.

    Raises:
        TurnNotFound: The turn was loaded and there is no such turn.
    """
    if seen is not None and fence is not None and time.monotonic() - seen.at <= FRESH_S:
        snapshot = cached(store, turn_id)
        if (
            snapshot is not None
            and snapshot.version == seen.version
            and (snapshot.lease_fence or 0) + 1 == fence
            and snapshot.is_runnable(now)
        ):
            return snapshot, True
    return store.load(turn_id), False


def continue_after_stale(
    result: AdvanceResult, from_cache: bool, advance: Callable[[AgentTurn], AdvanceResult]
) -> AdvanceResult:
    """`result`, or, when the first step from a cached snapshot found it stale, a new `advance` from the reloaded turn.

    The step that lost the compare-and-swap handed back the stored snapshot; continuing
    from it is what a holder that loaded the turn would have done.
    """
    if from_cache and result.steps == 0 and result.stopped is StopReason.CONFLICT:
        return advance(result.turn)
    return result
