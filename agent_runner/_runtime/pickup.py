"""Where a step starts from: the snapshot the store keeps at hand, when it is safe to skip the load.

A load is a round trip to the store. A store that implements `CachedSnapshots` hands back
the snapshot of its own last save or read instead, and the runner uses it only where a
stale one costs no wrong work:

- a resume validates its command against it and saves by compare-and-swap: a turn that
  moved on since refuses the save, and the resume loads and decides again (so does a
  command the cached snapshot does not fit, which may fit the stored one);
- a holder that has just taken a turn's lease steps from it only when it is the version
  the dispatch or the poll reported, it is runnable, and the new fence directly follows
  the fence it was saved under. Every step is saved under a lease, so no step was saved
  since. A write made without the lease in another process (a cancel flag, which keeps
  the version, or a change saved through another store object) is found by the step's
  first save: the compare-and-swap refuses a changed version, the returned snapshot
  carries the cancel flag, and the holder continues from the reloaded turn
  (`continue_after_stale`). Nothing is done twice that must not be: a tool that is not
  idempotent is marked started by a save before its body runs, and that save is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from agent_runner.persistence import AgentTurnStore, CachedSnapshots
from agent_runner.results import AdvanceResult, StopReason
from agent_runner.snapshot import AgentTurn


def cached(store: AgentTurnStore, turn_id: str) -> AgentTurn | None:
    """The store's cached snapshot of the turn; None when it keeps none or cannot (no `CachedSnapshots`)."""
    return store.cached_snapshot(turn_id) if isinstance(store, CachedSnapshots) else None


def under_lease(
    store: AgentTurnStore, turn_id: str, version: int | None, fence: int | None, now: datetime
) -> tuple[AgentTurn, bool]:
    """The snapshot to step a turn from once its lease is taken with `fence`, and whether it is the cached one.

    `version` is the version the caller saw the turn at (the dispatched snapshot, the
    poll's reference; None: unknown). The cached snapshot is used when it is that
    version, it is runnable at `now`, and no other holder took the lease since it was
    saved (`fence` is its lease fence plus one); otherwise the turn is loaded.

    Raises:
        TurnNotFound: The turn was loaded and there is no such turn.
    """
    if version is not None and fence is not None:
        snapshot = cached(store, turn_id)
        if (
            snapshot is not None
            and snapshot.version == version
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
