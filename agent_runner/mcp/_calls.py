"""A `tools/call` of an MCP server, its questions to the user as forms, and its result as ToolMessage text.

An input-required result (the server needs answers before it can go on) becomes an
`AgentFormRequiredException` carrying the server's request state: the runner saves it in
the snapshot and suspends the turn; the call runs again with the answer, in whichever
process picks the turn up, and the server goes on from that state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import anyio
from mcp import MCPError
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    ImageContent,
    InputRequiredResult,
    InputResponses,
    RequestParamsMeta,
    ResourceLink,
    Result,
    TextContent,
    TextResourceContents,
)

from agent_runner.errors import RecoverableError, ToolError
from agent_runner.forms import FORM_KEY_PATTERN, AgentFormDefinition, AgentFormRequiredException
from agent_runner.mcp import _tasks as tasks
from agent_runner.mcp._connection import (
    MCPProtocolError,
    MCPServerError,
    MCPUnreachableError,
    ServerAddress,
    connected,
    is_rejected_state,
)
from agent_runner.operations import OPERATION_KEY
from agent_runner.snapshot import ListedTool
from agent_runner.tools import AgentToolContext

IDEMPOTENCY_META_KEY = "io.agent-runner/idempotency-key"
"""The `_meta` key under which every `tools/call` carries the call's idempotency key (stable across retries)."""

URL_DONE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"done": {"type": "boolean", "title": "I have finished on that page"}},
    "required": ["done"],
}
"""The form of a URL request: the person says whether they finished on the page (false declines)."""

STATE_ONLY_ROUNDS = 10
"""How many times in a row a server may ask for the same call again without a question."""

_SIMPLE_TYPES = frozenset({"string", "number", "integer", "boolean"})


@dataclass(frozen=True)
class CallTarget:
    """What one call needs to know about its server and tool."""

    address: ServerAddress
    headers: Mapping[str, str]
    timeout: float
    max_result_bytes: int
    listed: ListedTool
    idempotent: bool


async def call_tool(target: CallTarget, arguments: dict[str, Any], context: AgentToolContext) -> str:
    """Call the tool, answering the server's last question with the submitted form data, and return its text.

    Raises:
        AgentFormRequiredException: The server asks the user something (with its state to keep).
        ToolError: The tool failed (`isError`), its result is too large, or it asked what no form can show.
        RecoverableError: The server was unreachable, slow or overloaded (try later).
        MCPServerError: As above, but the call may act twice and may have acted already.
        MCPProtocolError: The server broke the protocol.
    """
    state = context.get_tool_state()
    if OPERATION_KEY in state:
        return await _poll_task(target, state[OPERATION_KEY])
    responses, request_state = _answers(state, context.get_submitted_form_data(), context.form_declined)
    meta = cast(RequestParamsMeta, {IDEMPOTENCY_META_KEY: context.get_idempotency_key()})
    note = ""

    async def report(progress: float, total: float | None, message: str | None) -> None:
        context.report_progress({"progress": progress, "total": total, "message": message})

    try:
        async with connected(target.address, target.headers, target.timeout, [tasks.TasksExtension()]) as client:

            async def send(answers: InputResponses | None, sent_state: str | None) -> Result:
                return await client.session.call_tool(
                    target.listed.remote_name,
                    arguments,
                    read_timeout_seconds=target.timeout,
                    progress_callback=report,
                    input_responses=answers,
                    request_state=sent_state,
                    meta=meta,
                    allow_input_required=True,
                    allow_claimed=True,
                )

            try:
                result = await send(responses, request_state)
            except MCPError as exc:
                if not state or not is_rejected_state(exc):
                    raise
                # The server no longer knows the earlier rounds: start over, and say why to the person.
                note = (
                    "The service no longer accepted the earlier answers (it may have restarted); please answer again."
                )
                result = await send(None, None)
            rounds = 0
            while isinstance(result, InputRequiredResult) and not result.input_requests:
                rounds += 1
                if rounds > STATE_ONLY_ROUNDS:
                    raise MCPProtocolError(f"the MCP server asked for the same call {rounds} times without a question")
                await anyio.sleep(min(0.05 * 2**rounds, 1.0))
                result = await send(None, result.request_state)
    except RecoverableError as exc:
        if target.idempotent or exc.rate_limited or isinstance(exc, MCPUnreachableError):
            raise
        raise MCPServerError(f"{exc}; the call may have acted before it failed") from exc
    except MCPError as exc:
        raise ToolError(f"The MCP server refused the call: {exc.message}") from exc
    if isinstance(result, InputRequiredResult):
        raise _question(target.listed, result, int(state.get("round", 0)) + 1, note)
    if isinstance(result, tasks.TaskCreated):
        raise tasks.pending(result)
    if not isinstance(result, CallToolResult):
        raise MCPProtocolError(f"the MCP server answered tools/call with a {type(result).__name__}")
    return _text(result, target.max_result_bytes)


async def _poll_task(target: CallTarget, handle: Mapping[str, Any]) -> str:
    """Ask how the call's task goes (safe to repeat whatever the tool: it only reads)."""
    async with connected(target.address, target.headers, target.timeout) as client:
        result = await tasks.poll(client.session, handle, target.timeout)
    return _text(result, target.max_result_bytes)


async def cancel_task(target: CallTarget, handle: Mapping[str, Any]) -> None:
    """Cancel the call's task on the server."""
    async with connected(target.address, target.headers, target.timeout) as client:
        await tasks.cancel(client.session, handle, target.timeout)


def _answers(
    state: Mapping[str, Any], data: dict[str, Any], declined: bool
) -> tuple[InputResponses | None, str | None]:
    """The responses and request state of the round the person just answered or declined (none on a first call)."""
    key = state.get("input_key")
    if not isinstance(key, str):
        return None, None
    if declined:
        answer = ElicitResult(action="decline")
    elif state.get("mode") == "url":
        answer = ElicitResult(action="accept" if data.get("done") else "decline")
    else:
        answer = ElicitResult(action="accept", content=data)
    request_state = state.get("request_state")
    return {key: answer}, request_state if isinstance(request_state, str) else None


def _question(listed: ListedTool, result: InputRequiredResult, round_number: int, note: str) -> Exception:
    requests = result.input_requests or {}
    if len(requests) != 1:
        return ToolError(
            f"The MCP tool {listed.name!r} asked {len(requests)} questions at once; this client answers one at a time."
        )
    key, request = next(iter(requests.items()))
    if not isinstance(request, ElicitRequest):
        return ToolError(f"The MCP tool {listed.name!r} asked for {request.method}, which this client does not offer.")
    params = request.params
    form_key = _form_key(f"mcp:{listed.name}:{key}")
    message = f"{note} {params.message}".strip()
    if isinstance(params, ElicitRequestFormParams):
        why = unshowable(params.requested_schema)
        if why:
            return ToolError(f"The MCP tool {listed.name!r} asked a question no form can show ({why}), so it failed.")
        form = AgentFormDefinition(key=form_key, description=message, schema=dict(params.requested_schema))
        mode = "form"
    else:
        message = f"{message}\n{params.url}"
        form = AgentFormDefinition(key=form_key, description=message, schema=URL_DONE_SCHEMA)
        mode = "url"
    state: dict[str, Any] = {"request_state": result.request_state, "input_key": key, "mode": mode}
    state["round"] = round_number
    return AgentFormRequiredException(form, message, state=state, takes_decline=True)


def unshowable(schema: Any) -> str | None:
    """Why a form could not show `schema` (MCP asks for flat objects of plain fields), or None when it can."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "it is not an object"
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return "its properties are not an object"
    for name, field in properties.items():
        kind = field.get("type") if isinstance(field, dict) else None
        if kind in _SIMPLE_TYPES:
            continue
        items = field.get("items") if isinstance(field, dict) else None
        if kind == "array" and isinstance(items, dict) and ("enum" in items or "anyOf" in items):
            continue
        return f"field {name!r} is not a plain string, number, boolean or choice"
    try:
        AgentFormDefinition(key="check", schema=schema)
    except Exception as exc:
        return str(exc)
    return None


def _form_key(text: str) -> str:
    key = re.sub(r"[^A-Za-z0-9_.:-]", "_", text)[:128]
    assert re.match(FORM_KEY_PATTERN, key)
    return key


def _text(result: CallToolResult, max_bytes: int) -> str:
    parts: list[str] = []
    for item in result.content:
        if isinstance(item, TextContent):
            parts.append(item.text)
        elif isinstance(item, EmbeddedResource) and isinstance(item.resource, TextResourceContents):
            parts.append(item.resource.text)
        elif isinstance(item, EmbeddedResource):
            parts.append(f"[resource {item.resource.uri}]")
        elif isinstance(item, ResourceLink):
            parts.append(f"[link {item.uri}]")
        elif isinstance(item, ImageContent):
            parts.append(f"[image {item.mime_type}]")
        else:
            parts.append(f"[{item.type} content]")
    text = "\n".join(parts)
    if not parts and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    size = len(text.encode())
    if size > max_bytes:
        raise ToolError(f"The tool's result of {size} bytes is over the limit of {max_bytes} bytes, so it was refused.")
    if result.is_error:
        raise ToolError(text or "The tool failed without saying why.")
    return text


async def cancel_question(target: CallTarget, arguments: dict[str, Any], state: Mapping[str, Any]) -> None:
    """Answer the server's pending question with `cancel` (the turn ended before anyone answered); its reply is not read."""
    request_state = state.get("request_state")
    answers: InputResponses = {str(state["input_key"]): ElicitResult(action="cancel")}
    async with connected(target.address, target.headers, target.timeout) as client:
        await client.session.call_tool(
            target.listed.remote_name,
            arguments,
            read_timeout_seconds=target.timeout,
            input_responses=answers,
            request_state=request_state if isinstance(request_state, str) else None,
            allow_input_required=True,
        )
