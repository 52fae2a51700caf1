"""`MCPToolset`: an MCP server's tools as an entry of `Agent(tools=[...])`."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import jsonschema
from jsonschema.exceptions import SchemaError
from mcp import StdioServerParameters
from mcp_types import PaginatedRequestParams
from mcp_types import Tool as MCPToolDescription

from agent_runner.errors import DefinitionError, ToolArgumentsError
from agent_runner.limits import DEFAULT_LIMITS
from agent_runner.mcp._calls import CallTarget, call_tool, cancel_question, cancel_task
from agent_runner.mcp._connection import ServerAddress, connected, run_sync
from agent_runner.snapshot import ListedTool
from agent_runner.tools import TOOL_NAME_PATTERN, AgentToolContext, Tool
from agent_runner.toolsets import Toolset

logger = logging.getLogger("agent_runner.mcp")

Headers = Mapping[str, str] | Callable[[AgentToolContext], Mapping[str, str]]
ToolChoice = bool | Sequence[str] | Callable[[ListedTool], bool]


class MCPToolset(Toolset):
    """The tools of one MCP server, offered to the model with the server's own input schemas.

    Args:
        url: The server's streamable HTTP endpoint (`"https://tools.example.com/mcp"`), or
            an `mcp.StdioServerParameters` naming a local server's command, spoken to over stdio.
        name: Names the toolset in snapshots; unique among an agent's toolsets (default: the
            prefix, else the URL's host and port, else the command).
        headers: HTTP headers of every request: a mapping, or a function of the
            `AgentToolContext` (its `tenant_id`, `metadata`, ...) returning one, so that a
            tenant's credentials serve only that tenant's turns. While tools are listed,
            `context.tool_call.name` is `"tools/list"`.
        requires_approval: Suspend for a person's approval before a call: True for every
            tool, a list of the server's tool names, or a function of the `ListedTool`.
        include: Only these tools of the server (by the server's names).
        exclude: Never these tools.
        prefix: Put before every tool name the model sees (`"crm_"`), when two servers clash.
        idempotent: Whether a call may safely run twice. None (the default) reads the
            server's annotations: a tool that is neither `readOnlyHint` nor `idempotentHint`
            is treated as `@tool(idempotent=False)` (its start is saved first, and a call cut
            short is put to a person rather than run again). True, False, a list of tool
            names or a function of the `ListedTool` overrides the annotations.
        list_ttl: Seconds a listing is reused by this process (per set of headers).
        timeout: Seconds to wait for one answer of the server.
        max_result_bytes: A result larger than this is refused (an error ToolMessage).
    """

    def __init__(
        self,
        url: ServerAddress,
        *,
        name: str | None = None,
        headers: Headers | None = None,
        requires_approval: ToolChoice = False,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        prefix: str | None = None,
        idempotent: ToolChoice | None = None,
        list_ttl: float = 60.0,
        timeout: float = 30.0,
        max_result_bytes: int = DEFAULT_LIMITS.max_message_bytes,
    ) -> None:
        if not isinstance(url, str | StdioServerParameters):
            raise DefinitionError(f"MCPToolset takes a URL or StdioServerParameters, got {url!r}")
        if isinstance(url, str) and urlsplit(url).scheme not in ("http", "https"):
            raise DefinitionError(f"MCPToolset url must be http(s), got {url!r}")
        self.address: ServerAddress = url
        self.name = name or _default_name(url, prefix)
        self.headers = headers if headers is not None else {}
        self.requires_approval = requires_approval
        self.include = frozenset(include) if include is not None else None
        self.exclude = frozenset(exclude or ())
        self.prefix = prefix or ""
        if self.prefix and not TOOL_NAME_PATTERN.match(self.prefix):
            raise DefinitionError(f"MCPToolset prefix {self.prefix!r} must match {TOOL_NAME_PATTERN.pattern}")
        self.idempotent = idempotent
        if list_ttl < 0 or timeout <= 0 or max_result_bytes < 1:
            raise DefinitionError("MCPToolset: list_ttl must be >= 0, timeout and max_result_bytes > 0")
        self.list_ttl = list_ttl
        self.timeout = timeout
        self.max_result_bytes = max_result_bytes
        self._lock = threading.Lock()
        self._listings: dict[str, tuple[float, list[ListedTool]]] = {}
        self._tools: dict[tuple[str, str], MCPTool] = {}

    def __repr__(self) -> str:
        return f"MCPToolset(name={self.name!r})"

    def request_headers(self, context: AgentToolContext) -> dict[str, str]:
        """The headers of a request made for the call (or listing) `context` describes."""
        headers = self.headers(context) if callable(self.headers) else self.headers
        return {str(k): str(v) for k, v in headers.items()}

    def list_tools(self) -> list[ListedTool]:
        """The server's tools (cached for `list_ttl` seconds per set of headers), filtered and prefixed."""
        headers = self.request_headers(AgentToolContext.current())
        key = hashlib.sha256(json.dumps(sorted(headers.items())).encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            cached = self._listings.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        listed = [t for t in (self._listed(d) for d in run_sync(self._fetch(headers))) if t is not None]
        with self._lock:
            self._listings[key] = (now + self.list_ttl, listed)
        return listed

    async def _fetch(self, headers: Mapping[str, str]) -> list[MCPToolDescription]:
        tools: list[MCPToolDescription] = []
        async with connected(self.address, headers, self.timeout) as client:
            cursor: str | None = None
            while True:
                page = await client.session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools

    def _listed(self, description: MCPToolDescription) -> ListedTool | None:
        remote = description.name
        if (self.include is not None and remote not in self.include) or remote in self.exclude:
            return None
        name = self.prefix + remote
        why = _refusal(name, description.input_schema)
        if why:
            logger.warning("MCP server %s: tool %r is left out: %s", self.name, remote, why)
            return None
        annotations = (
            description.annotations.model_dump(by_alias=True, exclude_none=True) if description.annotations else {}
        )
        return ListedTool(
            toolset=self.name,
            name=name,
            remote_name=remote,
            description=description.description or description.title or "",
            parameters=dict(description.input_schema),
            annotations=annotations,
        )

    def tool(self, listed: ListedTool) -> MCPTool:
        """The `Tool` that calls `listed` with the schema the turn saw."""
        key = (listed.name, hashlib.sha256(json.dumps(listed.parameters, sort_keys=True).encode()).hexdigest())
        with self._lock:
            made = self._tools.get(key)
            if made is None:
                made = self._tools[key] = MCPTool(self, listed)
        return made

    def chooses(self, choice: ToolChoice | None, listed: ListedTool) -> bool:
        """Whether `choice` (a flag, a list of the server's names, or a function) picks `listed`."""
        if callable(choice):
            return bool(choice(listed))
        if isinstance(choice, bool) or choice is None:
            return bool(choice)
        return listed.remote_name in choice


def _refusal(name: str, schema: Any) -> str | None:
    if not TOOL_NAME_PATTERN.match(name):
        return f"its name {name!r} does not match {TOOL_NAME_PATTERN.pattern}"
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "its input schema is not a JSON Schema of an object"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return f"its input schema is not valid JSON Schema: {exc.message}"
    return None


def _default_name(url: ServerAddress, prefix: str | None) -> str:
    if prefix:
        return prefix.rstrip("_-") or prefix
    if isinstance(url, StdioServerParameters):
        return url.command.rsplit("/", 1)[-1]
    return urlsplit(url).netloc or "mcp"


def _no_arguments() -> None:
    """Stands in for the function of a Tool whose body is a call to a server."""


class MCPTool(Tool):
    """One tool of an MCP server, called with the arguments the model gave, against the schema the turn saw."""

    def __init__(self, toolset: MCPToolset, listed: ListedTool) -> None:
        annotations = listed.annotations
        if toolset.idempotent is None:
            idempotent = bool(annotations.get("readOnlyHint") or annotations.get("idempotentHint"))
        else:
            idempotent = toolset.chooses(toolset.idempotent, listed)
        super().__init__(
            _no_arguments,
            name=listed.name,
            description=listed.description,
            requires_approval=toolset.chooses(toolset.requires_approval, listed),
            idempotent=idempotent,
        )
        self.parameters = dict(listed.parameters)
        self.toolset = toolset
        self.listed = listed
        self._validator = jsonschema.validators.validator_for(self.parameters)(self.parameters)

    def validate_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check the arguments against the server's schema (as the turn saw it).

        Raises:
            ToolArgumentsError: They do not fit it.
        """
        errors = sorted(self._validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
        if errors:
            raise ToolArgumentsError(
                self.name,
                [f"{'.'.join(str(p) for p in e.absolute_path) or '(arguments)'}: {e.message}" for e in errors],
            )
        return dict(arguments)

    def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Call the tool on the server (see `call_tool`)."""
        checked = self.validate_arguments(arguments)
        context = AgentToolContext.current()
        return run_sync(call_tool(self._target(context), checked, context))

    def cancel_operation(self, handle: dict[str, Any]) -> None:
        """Cancel the task a call of this tool started on the server (`tasks/cancel`)."""
        run_sync(cancel_task(self._target(AgentToolContext.current()), handle))

    def call_abandoned(self, state: dict[str, Any]) -> None:
        """Cancel the call's task, or tell the server the person will not answer its question (`cancel`)."""
        super().call_abandoned(state)
        if "input_key" in state:
            context = AgentToolContext.current()
            run_sync(cancel_question(self._target(context), context.tool_call.arguments, state))

    def _target(self, context: AgentToolContext) -> CallTarget:
        toolset = self.toolset
        headers = toolset.request_headers(context)
        return CallTarget(
            toolset.address, headers, toolset.timeout, toolset.max_result_bytes, self.listed, self.idempotent
        )

    def __repr__(self) -> str:
        return f"MCPTool(name={self.name!r}, toolset={self.toolset.name!r})"
