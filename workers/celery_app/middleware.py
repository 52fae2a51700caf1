"""Middleware the Celery workers add to their runner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from agent_runner import Middleware, RecoverableError, ToolCall
from agent_runner.models import ChatRequest, ChatResponse


class SoftTimeLimitAsRetry(Middleware):
    """Turns Celery's soft time limit, raised inside a model or tool call, into a retry.

    The limit fires when one call hangs. Without this the runner would see an unknown
    exception and fail the turn for good; a hung call is a transient failure, so the turn
    is retried with backoff like a timeout. The call runs again with the same idempotency
    key. A call of a non-idempotent tool is not: the runner sees that its body did not
    itself raise `RecoverableError`, so the call may have acted, and it is reconciled or
    put to a person instead (see `agent_runner.Tool.reconcile`).
    """

    def wrap_model(self, request: ChatRequest, call_next: Callable[[ChatRequest], ChatResponse]) -> ChatResponse:
        """Run the model call; a soft time limit becomes a `RecoverableError`."""
        try:
            return call_next(request)
        except SoftTimeLimitExceeded as exc:
            raise RecoverableError("the model call ran past the worker's soft time limit") from exc

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        """Run the tool call; a soft time limit becomes a `RecoverableError`."""
        try:
            return call_next(tool_call)
        except SoftTimeLimitExceeded as exc:
            raise RecoverableError(f"tool {tool_call.name!r} ran past the worker's soft time limit") from exc
