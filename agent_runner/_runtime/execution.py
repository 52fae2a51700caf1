"""The two execution modes: turns run in the calling thread, or are handed to a dispatcher."""

from __future__ import annotations

from agent_runner._runtime.context import Execution, RunnerContext
from agent_runner._runtime.reentry import is_driving
from agent_runner._runtime.stepping import run_until_blocked
from agent_runner.persistence import TurnDispatcher
from agent_runner.snapshot import AgentTurn


class Inline:
    """Turns run in the calling thread: children are driven recursively, nothing is handed off."""

    def __init__(self, ctx: RunnerContext) -> None:
        self.ctx = ctx

    def dispatch(self, turn: AgentTurn) -> None:
        """Nothing to hand over: whoever runs the turn continues it."""

    def children_waiting(self, parent: AgentTurn) -> AgentTurn:
        """Run the parent's unfinished children here; return the parent's latest snapshot."""
        ctx = self.ctx
        for link in parent.children:
            if link.status is None:
                child = ctx.turn_store.load(link.child_turn_id)
                if child.is_runnable(ctx.clock()):
                    run_until_blocked(ctx, child)
        return ctx.turn_store.load(parent.id)

    def parent_resumed(self, parent: AgentTurn) -> None:
        """Continue the parent here, unless this thread is already driving it (it continues then)."""
        if not is_driving(self.ctx, parent.id):
            run_until_blocked(self.ctx, parent)


class Dispatching:
    """Turns that become runnable are handed to a dispatcher (a worker pool, a Celery queue)."""

    def __init__(self, dispatcher: TurnDispatcher) -> None:
        self.dispatcher = dispatcher

    def dispatch(self, turn: AgentTurn) -> None:
        """Hand the turn over."""
        self.dispatcher.dispatch(turn)

    def children_waiting(self, parent: AgentTurn) -> AgentTurn:
        """The children were dispatched when they were created: the parent just waits."""
        return parent

    def parent_resumed(self, parent: AgentTurn) -> None:
        """Hand the parent over."""
        self.dispatcher.dispatch(parent)


def execution_mode(ctx: RunnerContext, dispatcher: TurnDispatcher | None) -> Execution:
    """Inline without a dispatcher, else handing turns to it."""
    return Inline(ctx) if dispatcher is None else Dispatching(dispatcher)
