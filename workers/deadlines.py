"""Applying approval and form deadlines: reminders and defaults of waiting turns whose time has come.

The beat sweep `sweep_deadlines` (Celery deployments) and the HTTP server's embedded mode
call `apply_due_deadlines` periodically. Each due turn goes through
`AgentRunner.apply_deadline`: a compare-and-swap decision, so two sweeps at once (two
beats by mistake) remind once and apply a default once, and a person who decided first wins.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Protocol

from agent_runner import AgentRunner, AgentRunnerError, TurnRef

logger = logging.getLogger("workers.deadlines")

BATCH = 500
"""Most turns one sweep handles; the rest waits for the next sweep, earliest first."""


class DeadlineSource(Protocol):
    """A store that lists waiting turns whose deadline reminder or deadline is due."""

    def list_due_timers(self, now: datetime, limit: int = 100) -> list[TurnRef]:
        """Waiting turns whose reminder or deadline is due at `now`, earliest first."""
        ...


def apply_due_deadlines(runner: AgentRunner, source: DeadlineSource, limit: int = BATCH) -> int:
    """Send due reminders and apply passed deadlines' defaults; return how many turns were handled.

    A turn resumed by its default is handed on like any resume: enqueued for the Celery
    workers by a dispatching runner, picked up by the embedded worker otherwise.
    """
    handled = 0
    for ref in source.list_due_timers(runner.clock(), limit):
        try:
            runner.apply_deadline(ref.turn_id)
            handled += 1
        except AgentRunnerError as exc:
            logger.warning("could not apply the deadline of turn %s: %s", ref.turn_id, exc)
    return handled
