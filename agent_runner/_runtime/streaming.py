"""The `on_delta` of a streaming model call: MODEL_DELTA events, and a watch on the turn's cancel flag."""

from __future__ import annotations

from agent_runner import event_payloads as payloads
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import emit
from agent_runner.snapshot import AgentTurn


class CancelledMidCall(Exception):
    """Raised through a streaming model call whose turn was cancelled meanwhile."""


class DeltaSink:
    """`ChatRequest.on_delta` of one model call: MODEL_DELTA events, and a watch on the cancel flag.

    A cancel of a RUNNING turn only sets its flag. While the answer streams, the runner's
    `CancelWatch` reads the flags of all its streaming turns every half second; once this
    turn's is seen, the stream is abandoned (the model adapter stops reading, so no more
    tokens are paid for) and the turn ends. `close` when the call has returned.
    """

    def __init__(self, ctx: RunnerContext, turn: AgentTurn) -> None:
        self.ctx = ctx
        self.turn = turn
        self.watching = False

    def __call__(self, text: str) -> None:
        if not self.watching:
            self.watching = True  # from the first delta: a model that does not stream costs nothing
            self.ctx.cancel_watch.watch(self.turn.id)
        elif self.ctx.cancel_watch.cancelled(self.turn.id):
            raise CancelledMidCall(self.turn.id)
        # The fence tells the deltas of an abandoned call (its worker died) from the re-run's.
        if self.ctx.listeners:
            emit(self.ctx, payloads.model_delta(text, self.turn.lease_fence), self.turn)

    def close(self) -> None:
        """The model call has ended: stop watching the turn's cancel flag."""
        if self.watching:
            self.watching = False
            self.ctx.cancel_watch.unwatch(self.turn.id)
