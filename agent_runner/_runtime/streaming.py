"""The `on_delta` of a streaming model call: MODEL_DELTA events, and a watch on the turn's cancel flag."""

from __future__ import annotations

import time

from agent_runner import event_payloads as payloads
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import emit
from agent_runner.errors import AgentRunnerError
from agent_runner.snapshot import AgentTurn


class CancelledMidCall(Exception):
    """Raised through a streaming model call whose turn was cancelled meanwhile."""


class DeltaSink:
    """`ChatRequest.on_delta` of one model call: MODEL_DELTA events, and a watch on the cancel flag.

    A cancel of a RUNNING turn only sets its flag. While the answer streams, the flag is
    read at most every `CANCEL_CHECK_S` seconds; once it is seen, the stream is abandoned
    (the model adapter stops reading, so no more tokens are paid for) and the turn ends.
    """

    CANCEL_CHECK_S = 0.5

    def __init__(self, ctx: RunnerContext, turn: AgentTurn) -> None:
        self.ctx = ctx
        self.turn = turn
        self.next_check = time.monotonic() + self.CANCEL_CHECK_S

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + self.CANCEL_CHECK_S
            try:
                cancelled = self.ctx.turn_store.get_ref(self.turn.id).cancel_requested
            except AgentRunnerError:
                cancelled = False  # the store is the truth; its blip must not break the stream
            if cancelled:
                raise CancelledMidCall(self.turn.id)
        # The fence tells the deltas of an abandoned call (its worker died) from the re-run's.
        if self.ctx.listeners:
            emit(self.ctx, payloads.model_delta(text, self.turn.lease_fence), self.turn)
