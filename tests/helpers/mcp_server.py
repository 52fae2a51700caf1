"""An MCP server for the tests, built on the `mcp` SDK's server API and run as a process of its own.

`python -m tests.helpers.mcp_server --port N --state-dir DIR [--state-key HEX]` serves
streamable HTTP at `http://127.0.0.1:N/mcp`. Its tools:

- `add` (read-only), `whoami` (read-only: the `Authorization` and `X-Tenant` headers it got);
- `delete_record` (destructive): appends the idempotency key of each call (the request's
  `_meta`) to `DIR/started`, sleeps `hold` seconds, then acts once per key (a call with a key
  it has done already is answered as before) and counts its executions in `DIR/executions.json`;
- `executions` (read-only): those counts;
- `flaky` (read-only): answers HTTP 503 with `Retry-After: 1` to its first `fail_times` calls
  per `key`, then succeeds;
- `book_trip`: asks two forms, one after the other (an `InputRequiredResult` each), then books
  (counting its bookings per idempotency key in `DIR/bookings.json`);
- `link_account`: asks the person to open a link (a URL elicitation), then answers;
- `progress`: reports progress twice, then answers;
- `long_job` (with the tasks extension): answers a task at once, done `seconds` later
  (polled with `tasks/get`, cancelled with `tasks/cancel`; kept in `DIR/tasks.json`);
- `broken` and `huge`: a tool whose result is an error (`isError`), one whose result is large.

The request state is sealed with `--state-key` (hex; a fresh key when absent), so a server
restarted with another key refuses the state of an earlier round, as a redeployed server would.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
    RequestParams,
    TextContent,
    ToolAnnotations,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.helpers.api_server import free_port
from tests.helpers.processes import with_tests_importable

IDEMPOTENCY_META_KEY = "io.agent-runner/idempotency-key"

DESTINATION_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "title": "City"}},
    "required": ["city"],
}
DATES_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {"nights": {"type": "integer", "minimum": 1, "title": "Nights"}},
    "required": ["nights"],
}


def build_server(state_dir: Path, state_key: bytes | None) -> MCPServer:
    security = RequestStateSecurity(keys=[state_key]) if state_key else RequestStateSecurity.ephemeral()
    server = MCPServer("test-tools", request_state_security=security, extensions=[Tasks(state_dir)])
    lock = threading.Lock()
    executions_file = state_dir / "executions.json"

    def counts() -> dict[str, int]:
        return json.loads(executions_file.read_text()) if executions_file.exists() else {}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def whoami(ctx: Context) -> str:
        """Say which credentials the call came with."""
        headers = ctx.headers or {}
        return json.dumps({"authorization": headers.get("authorization"), "tenant": headers.get("x-tenant")})

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    async def delete_record(record_id: str, ctx: Context, hold: float = 0.0) -> str:
        """Delete a record for good (a call with a key that was already done is answered as before, not run again)."""
        key = str(dict(ctx.request_context.meta or {}).get(IDEMPOTENCY_META_KEY))
        with (state_dir / "started").open("a") as started:
            started.write(key + "\n")
        await anyio.sleep(hold)
        with lock:
            seen = counts()
            if key not in seen or key == "None":
                seen[key] = seen.get(key, 0) + 1
                executions_file.write_text(json.dumps(seen))
        return f"deleted {record_id}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def executions() -> str:
        """How many times delete_record ran, per idempotency key."""
        return json.dumps(counts())

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def flaky(key: str, fail_times: int = 1) -> str:
        """Succeed once the HTTP layer stopped refusing the call."""
        return f"ok {key}"

    _add_questions(server, state_dir)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def progress(ctx: Context) -> str:
        """Work in two halves, saying how far it got."""
        await ctx.report_progress(1, 2, "half way")
        await ctx.report_progress(2, 2, "done")
        return "finished"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def broken() -> CallToolResult:
        """Always fails."""
        return CallToolResult(content=[TextContent(text="the backend said no")], is_error=True)

    @server.tool()
    def long_job(name: str, seconds: float) -> str:
        """Run a job that takes a while (as a task, for a client that takes tasks)."""
        return f"job {name} done"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def huge(size: int) -> str:
        """Answer `size` bytes."""
        return "x" * size

    return server


def _add_questions(server: MCPServer, state_dir: Path) -> None:
    """The tools that ask the user something before they answer (a refusal is noted in `DIR/refused`)."""

    @server.tool()
    def book_trip(ctx: Context, traveller: str) -> CallToolResult | InputRequiredResult:
        """Book a trip; asks where to and for how long."""
        answers = ctx.input_responses or {}
        state = json.loads(ctx.request_state) if ctx.request_state else {}
        for key, answer in answers.items():
            if not isinstance(answer, ElicitResult):
                continue
            if answer.action != "accept":
                with (state_dir / "refused").open("a") as refused:
                    refused.write(f"{key}:{answer.action}\n")
                return CallToolResult(
                    content=[TextContent(text=f"booking {answer.action}d by the user")], is_error=True
                )
            state[key] = answer.content
        if "destination" not in state:
            ask = ElicitRequestFormParams(message="Where to?", requested_schema=DESTINATION_FORM)
            return InputRequiredResult(
                input_requests={"destination": ElicitRequest(params=ask)}, request_state=json.dumps(state)
            )
        if "dates" not in state:
            ask = ElicitRequestFormParams(
                message=f"How many nights in {state['destination']['city']}?", requested_schema=DATES_FORM
            )
            return InputRequiredResult(
                input_requests={"dates": ElicitRequest(params=ask)}, request_state=json.dumps(state)
            )
        text = f"booked {state['dates']['nights']} nights in {state['destination']['city']} for {traveller}"
        key = str(dict(ctx.request_context.meta or {}).get(IDEMPOTENCY_META_KEY))
        bookings_file = state_dir / "bookings.json"
        bookings = json.loads(bookings_file.read_text()) if bookings_file.exists() else {}
        bookings[key] = bookings.get(key, 0) + 1
        bookings_file.write_text(json.dumps(bookings))
        return CallToolResult(content=[TextContent(text=text)])

    @server.tool()
    def ask_nested(ctx: Context) -> CallToolResult | InputRequiredResult:
        """Ask for an address as a nested object, which MCP forms do not allow."""
        schema = {"type": "object", "properties": {"address": {"type": "object", "properties": {}}}}
        ask = ElicitRequestFormParams(message="Your address?", requested_schema=schema)
        return InputRequiredResult(input_requests={"address": ElicitRequest(params=ask)}, request_state="{}")

    @server.tool()
    def link_account(ctx: Context) -> CallToolResult | InputRequiredResult:
        """Link the user's account; the user signs in on a page of ours."""
        answer = (ctx.input_responses or {}).get("signin")
        if isinstance(answer, ElicitResult) and answer.action == "accept":
            return CallToolResult(content=[TextContent(text="account linked")])
        if isinstance(answer, ElicitResult):
            return CallToolResult(content=[TextContent(text=f"sign-in {answer.action}")], is_error=True)
        ask = ElicitRequestURLParams(message="Sign in to link your account", url="https://example.test/signin?s=1")
        return InputRequiredResult(input_requests={"signin": ElicitRequest(params=ask)}, request_state="{}")


TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


class TaskParams(RequestParams):
    task_id: str


class Tasks(Extension):
    """The tasks extension for `long_job`: its calls answer a task at once, done `seconds` later.

    Tasks are kept in `DIR/tasks.json`, so they outlive a restart of the server, and a
    cancelled task is listed in `DIR/cancelled`.
    """

    identifier = TASKS_EXTENSION

    def __init__(self, state_dir: Path) -> None:
        self.file = state_dir / "tasks.json"
        self.cancelled = state_dir / "cancelled"

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self.get),
            MethodBinding("tasks/cancel", TaskParams, self.cancel),
        ]

    def _tasks(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.file.read_text()) if self.file.exists() else {}

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if params.name != "long_job":
            return await call_next(ctx)
        arguments = params.arguments or {}
        task_id = os.urandom(8).hex()
        tasks = self._tasks()
        tasks[task_id] = {
            "ready_at": time.time() + float(arguments.get("seconds", 1)),
            "text": f"job {arguments.get('name')} done",
            "status": "working",
        }
        self.file.write_text(json.dumps(tasks))
        return {"resultType": "task", **self._shape(task_id, tasks[task_id])}

    def _shape(self, task_id: str, task: dict[str, Any]) -> dict[str, Any]:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {
            "taskId": task_id,
            "status": task["status"],
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttlMs": 600_000,
            "pollIntervalMs": 200,
        }

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        task = self._tasks()[params.task_id]
        shape = self._shape(params.task_id, task)
        if task["status"] == "working" and time.time() >= task["ready_at"]:
            shape["status"] = "completed"
            shape["result"] = {"content": [{"type": "text", "text": task["text"]}], "isError": False}
        return shape

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        tasks = self._tasks()
        tasks[params.task_id]["status"] = "cancelled"
        self.file.write_text(json.dumps(tasks))
        with self.cancelled.open("a") as cancelled:
            cancelled.write(params.task_id + "\n")
        return {}


class RefuseFlakyCalls:
    """Answer 503 to the first `fail_times` calls of `flaky` per key, as an overloaded server would."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.refused: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        params = request.get("params") if isinstance(request, dict) else None
        if isinstance(params, dict) and request.get("method") == "tools/call" and params.get("name") == "flaky":
            arguments = params.get("arguments") or {}
            key = str(arguments.get("key"))
            if self.refused.get(key, 0) < int(arguments.get("fail_times", 1)):
                self.refused[key] = self.refused.get(key, 0) + 1
                await send({"type": "http.response.start", "status": 503, "headers": [(b"retry-after", b"1")]})
                await send({"type": "http.response.body", "body": b"overloaded"})
                return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class MCPServerProcess:
    """The server above as a child process, which a test may stop, restart or kill."""

    def __init__(self, state_dir: Path, state_key: str | None = None) -> None:
        self.state_dir = state_dir
        self.hidden: list[str] = []
        self.state_key = state_key if state_key is not None else os.urandom(32).hex()
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> MCPServerProcess:
        command = [sys.executable, "-m", "tests.helpers.mcp_server", "--port", str(self.port)]
        command += ["--state-dir", str(self.state_dir), "--state-key", self.state_key]
        command += [arg for name in self.hidden for arg in ("--hide", name)]
        log = open(self.state_dir / "server.log", "ab")
        self.process = subprocess.Popen(
            command, env=with_tests_importable(os.environ), stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the MCP server exited: {(self.state_dir / 'server.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the MCP server did not start in 20 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def restart(self, *, new_key: bool = False, hide: list[str] | None = None) -> None:
        """Stop and start again on the same port; with `new_key`, earlier request states are refused;
        `hide` names tools the new version no longer offers (a redeploy)."""
        self.stop()
        self.hidden = list(hide or [])
        if new_key:
            self.state_key = os.urandom(32).hex()
        self.start()

    def refused_questions(self) -> list[str]:
        """`<question>:<decline or cancel>` for each question of `book_trip` the client refused."""
        path = self.state_dir / "refused"
        return path.read_text().split() if path.exists() else []

    def cancelled_tasks(self) -> list[str]:
        """The ids of the tasks a client cancelled."""
        path = self.state_dir / "cancelled"
        return path.read_text().split() if path.exists() else []

    def started(self) -> list[str]:
        """The idempotency keys of the `delete_record` calls that reached the server, in order."""
        path = self.state_dir / "started"
        return path.read_text().split() if path.exists() else []

    def bookings(self) -> dict[str, int]:
        """How many times `book_trip` booked, per idempotency key."""
        path = self.state_dir / "bookings.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def executions(self) -> dict[str, int]:
        """How many times `delete_record` ran, per idempotency key."""
        path = self.state_dir / "executions.json"
        return json.loads(path.read_text()) if path.exists() else {}


def running_mcp_server(state_dir: Path) -> Iterator[MCPServerProcess]:
    """Start the server with its state in `state_dir`; stop it when resumed (a generator for fixtures)."""
    server = MCPServerProcess(state_dir).start()
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--state-key", default=None)
    parser.add_argument("--hide", action="append", default=[], help="a tool this server does not offer")
    args = parser.parse_args()
    key = bytes.fromhex(args.state_key) if args.state_key else None
    server = build_server(args.state_dir, key)
    for name in args.hide:
        server.remove_tool(name)
    app = RefuseFlakyCalls(server.streamable_http_app(stateless_http=True))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
