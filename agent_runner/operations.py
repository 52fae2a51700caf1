"""Work that runs elsewhere and outlives a step: an MCP task, a background model response.

A tool whose call started such work raises `OperationPending` with a handle (JSON). The
turn then waits RETRY_SCHEDULED, holding no thread, with the handle in its snapshot; when
the next poll is due, whichever process picks the turn up runs the tool again, which reads
the handle (`AgentToolContext.current().get_tool_state()["operation"]`) and asks how the
work goes: still running (raise `OperationPending` again), done (return the result), or
failed (raise `ToolError`). A turn cancelled meanwhile calls the tool's `cancel_operation`.

A chat model can do the same for its answer (a background response): its `generate` raises
`OperationPending`, the turn waits the same way, and each poll calls the model's
`poll_operation(handle)` (the answer, or `OperationPending` again) instead of `generate`; a
turn that ends meanwhile calls its `cancel_operation(handle)`. Polls are not model calls: they
do not count against the shared model limits.
"""

from __future__ import annotations

from typing import Any

OPERATION_KEY = "operation"
"""Key of the handle in the call's tool state."""
POLLS_KEY = "polls"
"""Key of the number of polls made so far in the call's tool state."""
FIRST_POLL_S = 1.0
LAST_POLL_S = 60.0


class OperationPending(Exception):
    """Raised by a tool: the work its call started runs elsewhere and is not done yet; poll again later.

    Args:
        handle: What the tool needs to ask about the work again (JSON), saved in the snapshot.
        status: What the work is doing, in a few words (shown on the turn while it waits).
        poll_after: Seconds the work asks to be left alone before the next poll; the runner's
            backoff (1 s doubling up to 60 s) is kept to when it is longer.
    """

    def __init__(self, handle: dict[str, Any], *, status: str = "running", poll_after: float | None = None) -> None:
        self.handle = handle
        self.status = status
        self.poll_after = poll_after
        super().__init__(f"operation {status}")


def next_poll(polls: int, poll_after: float | None) -> float:
    """Seconds until poll number `polls + 1`: 1 s doubling up to 60 s, never sooner than the work asks."""
    backoff = FIRST_POLL_S * 2.0**polls
    if poll_after is not None and poll_after >= 0:
        backoff = max(backoff, poll_after)
    return float(min(backoff, LAST_POLL_S))
