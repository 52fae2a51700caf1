"""Toolsets: tools an agent learns at run time from a server (MCP), listed once per turn into its snapshot."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from agent_runner.messages import ToolCall
from agent_runner.models import ToolSpec
from agent_runner.snapshot import AgentTurn, ListedTool
from agent_runner.tools import Tool, tool_scope

logger = logging.getLogger("agent_runner")

LIST_TOOLS_CALL = "tools/list"
"""The name of the `tool_call` an `AgentToolContext` shows while a toolset lists its tools."""


class Toolset:
    """A source of tools listed at run time, an entry of `Agent(tools=[...])` beside `@tool` functions.

    The runner lists a toolset's tools when a turn first calls its model and keeps that list
    in the turn's snapshot (`AgentTurn.listed_tools`); later steps, in any process, call the
    tools the model was shown. `agent_runner.mcp.MCPToolset` is the one for MCP servers.
    """

    name: str
    """Unique among the agent's toolsets; the snapshot names each listed tool's toolset by it."""

    def list_tools(self) -> list[ListedTool]:
        """The tools to offer now; runs with an `AgentToolContext` whose `tool_call.name` is `tools/list`."""
        raise NotImplementedError

    def tool(self, listed: ListedTool) -> Tool:
        """The `Tool` that calls `listed` (one of this toolset's tools, as a turn saw it)."""
        raise NotImplementedError


def list_turn_tools(toolsets: Sequence[Toolset], taken: Iterable[str], turn: AgentTurn) -> list[ListedTool]:
    """List every toolset's tools for `turn`, leaving out (with a warning) a name another tool has already."""
    names = set(taken)
    listed: list[ListedTool] = []
    for toolset in toolsets:
        with tool_scope(turn, ToolCall(id=f"{toolset.name}-list", name=LIST_TOOLS_CALL), {}, lambda _: None):
            offered = toolset.list_tools()
        for item in offered:
            if item.name in names:
                logger.warning(
                    "toolset %r offers a tool %r, a name the agent has already; it is left out (give the toolset a prefix)",
                    toolset.name,
                    item.name,
                )
                continue
            names.add(item.name)
            listed.append(item)
    return listed


def listed_specs(listed: Sequence[ListedTool] | None) -> list[ToolSpec]:
    """What the model is told about the listed tools."""
    return [ToolSpec(name=t.name, description=t.description, parameters=t.parameters) for t in listed or ()]
