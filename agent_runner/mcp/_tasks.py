"""The MCP tasks extension (`io.modelcontextprotocol/tasks`): a call answered with a task, polled durably.

A `tools/call` the server answers with a task becomes `OperationPending` with the task id
as its handle: the turn waits RETRY_SCHEDULED, holding no thread, and each poll, in
whichever process picks the turn up, asks `tasks/get`. A turn that ends while the task
runs sends `tasks/cancel`. The `mcp` SDK has no client for the extension yet, so its
three shapes are declared here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ValidationError

from agent_runner.errors import ToolError
from agent_runner.mcp._connection import MCPProtocolError
from agent_runner.operations import OperationPending

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_ID_KEY = "task_id"
"""Key of the task id in the handle kept in the snapshot."""


class TaskCreated(Result):
    """A `tools/call` answered with a task (`resultType: "task"`)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str = "working"
    status_message: str | None = None
    poll_interval_ms: int | None = None


class TaskState(Result):
    """A `tasks/get` answer: the task's status, and its result or error once it ended."""

    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskParams(RequestParams):
    task_id: str


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams


async def _never_resolved(created: TaskCreated, context: ClaimContext) -> CallToolResult:
    # Calls are made with allow_claimed=True: a task is waited for by the runner, never here.
    raise MCPProtocolError(f"task {created.task_id} reached the SDK's in-memory resolver")


class TasksExtension(ClientExtension):
    """Says to servers that this client takes tasks, and parses the task answer of a `tools/call`."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=_never_resolved)]


def pending(created: TaskCreated | TaskState) -> OperationPending:
    """The wait for a task that is still running."""
    poll_after = created.poll_interval_ms / 1000 if created.poll_interval_ms is not None else None
    status = created.status_message or created.status
    return OperationPending({TASK_ID_KEY: created.task_id}, status=status, poll_after=poll_after)


async def poll(session: ClientSession, handle: Mapping[str, Any], timeout: float) -> CallToolResult:
    """The result of the task, once it ended.

    Raises:
        OperationPending: It still runs (or waits for input this client cannot give within a task).
        ToolError: It failed or was cancelled.
    """
    task_id = str(handle[TASK_ID_KEY])
    state = await session.send_request(GetTask(params=TaskParams(task_id=task_id)), TaskState, timeout)
    if state.status == "completed":
        try:
            return CallToolResult.model_validate(state.result or {}, by_name=False)
        except ValidationError as exc:
            raise MCPProtocolError(f"task {task_id} completed with a result that is not a tool result: {exc}") from exc
    if state.status == "failed":
        message = (state.error or {}).get("message", "no reason given")
        raise ToolError(f"The tool's task failed: {message}")
    if state.status == "cancelled":
        raise ToolError(f"The tool's task was cancelled{': ' + state.status_message if state.status_message else ''}.")
    if state.status == "input_required":
        raise ToolError("The tool's task asked for input, which this client answers only before a task starts.")
    raise pending(state)


async def cancel(session: ClientSession, handle: Mapping[str, Any], timeout: float) -> None:
    """Ask the server to cancel the task."""
    await session.send_request(CancelTask(params=TaskParams(task_id=str(handle[TASK_ID_KEY]))), Result, timeout)
