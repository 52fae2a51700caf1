"""The `on_delta` of a streaming model call: MODEL_DELTA events, and a watch on the turn's cancel flag."""

from __future__ import annotations

from typing import Any

from agent_runner import event_payloads as payloads
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import deliver, unsaved_event
from agent_runner.events import AgentEvent, AgentEventType
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
        self._data: dict[str, Any] | None = None  # the `data` of this call's deltas, but for the text

    def event(self, text: str) -> AgentEvent:
        """The MODEL_DELTA event of `text`; what every delta of the call shares is built once."""
        data = self._data
        if data is None:
            # The fence tells the deltas of an abandoned call (its worker died) from the re-run's.
            data = self._data = payloads.model_delta("", self.turn.lease_fence).data(
                self.turn.status, self.turn.version
            )
        return unsaved_event(AgentEventType.MODEL_DELTA, self.turn, {**data, "delta": text})

    def __call__(self, text: str) -> None:
        if not self.watching:
            self.watching = True  # from the first delta: a model that does not stream costs nothing
            self.ctx.cancel_watch.watch(self.turn.id)
        elif self.ctx.cancel_watch.cancelled(self.turn.id):
            raise CancelledMidCall(self.turn.id)
        if self.ctx.listeners:
            deliver(self.ctx, self.event(text))

    def close(self) -> None:
        """The model call has ended: stop watching the turn's cancel flag."""
        if self.watching:
            self.watching = False
            self.ctx.cancel_watch.unwatch(self.turn.id)
