"""Agent definitions and the in-memory agent loader."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_runner.errors import AgentNotFound, DefinitionError
from agent_runner.messages import ToolCall
from agent_runner.models import ChatModel, ToolSpec
from agent_runner.policy import Budget, FinalAnswer, RetryPolicy
from agent_runner.snapshot import AgentTurn
from agent_runner.tools import AgentUserInputTool, AnyTool, Tool
from agent_runner.toolsets import Toolset

AGENT_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(eq=False)
class Agent:
    """What an agent is: instructions, a chat model, tools, limits and sub-agents.

    Args:
        id: Stable id; sub-agents are offered to their parent's model as a tool of this name.
        version: Version of the definition; snapshots record it and `restore` asks for it.
        instructions: System message sent first in every model request.
        chat_model: The `ChatModel` to call.
        tools: `@tool` functions, at most one `AgentUserInputTool`, and toolsets (an MCP
            server's `agent_runner.mcp.MCPToolset`), whose tools are listed when a turn starts.
        max_iterations: Model calls allowed per turn (MAX_ITERATIONS_REACHED beyond).
        max_attached_messages: Size of the history window read from ChatMemory.
        budget: Token and cost limits per turn, child turns included (BUDGET_EXCEEDED beyond).
        sub_agents: Agents this one may delegate a task to; each runs as a child turn.
        description: What the agent does; shown to a parent model when this agent is a sub-agent.
        retry: The retry schedule and transient error types of this agent's model and tool
            calls (default: the runner's `AgentExecutionPolicy.retry`).
        final_answer: Ask the model for a last answer, without tools, when a turn stops for
            its budget, iterations or steps (None: such a turn ends with the close-out line only).
    """

    id: str
    version: str = "1"
    instructions: str = ""
    chat_model: ChatModel | None = None
    tools: Sequence[AnyTool | Toolset] = field(default_factory=list)
    max_iterations: int = 10
    max_attached_messages: int = 50
    budget: Budget = field(default_factory=Budget)
    sub_agents: Sequence[Agent] = field(default_factory=list)
    description: str = ""
    retry: RetryPolicy | None = None
    final_answer: FinalAnswer | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not AGENT_ID_PATTERN.match(self.id):
            raise DefinitionError(f"agent id {self.id!r} must match {AGENT_ID_PATTERN.pattern}")
        self.version = str(self.version)
        if self.max_iterations < 1:
            raise DefinitionError(f"agent {self.id!r}: max_iterations must be at least 1, got {self.max_iterations}")
        if self.max_attached_messages < 0:
            raise DefinitionError(f"agent {self.id!r}: max_attached_messages must be >= 0")
        reserve = self.final_answer
        budget = self.budget
        if reserve is not None and (
            (budget.max_total_tokens is not None and reserve.reserved_tokens > budget.max_total_tokens)
            or (budget.max_cost is not None and reserve.reserved_cost > budget.max_cost)
        ):
            raise DefinitionError(f"agent {self.id!r}: the final answer reserves more than the budget holds")
        self.toolsets: list[Toolset] = [t for t in self.tools if isinstance(t, Toolset)]
        """The entries of `tools` that are toolsets (the rest stay in `tools`)."""
        tools: list[AnyTool] = []
        for item in self.tools:
            if isinstance(item, Toolset):
                continue
            if not isinstance(item, Tool | AgentUserInputTool):
                raise DefinitionError(f"agent {self.id!r}: {item!r} is not a tool; decorate the function with @tool")
            tools.append(item)
        self.tools = tools
        self.sub_agents = list(self.sub_agents)
        toolset_names = [t.name for t in self.toolsets]
        if len(set(toolset_names)) != len(toolset_names):
            raise DefinitionError(f"agent {self.id!r} has several toolsets named alike: {sorted(toolset_names)}")
        self._toolsets: dict[str, Toolset] = {t.name: t for t in self.toolsets}
        names = [t.name for t in tools] + [sub.id for sub in self.sub_agents]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise DefinitionError(f"agent {self.id!r} has several tools or sub-agents named {duplicates}")
        self._tools: dict[str, AnyTool] = {t.name: t for t in tools}
        self._sub_agents: dict[str, Agent] = {a.id: a for a in self.sub_agents}
        self._specs: list[ToolSpec] | None = None

    def tool(self, name: str) -> AnyTool | None:
        """Return the tool with this name, or None."""
        return self._tools.get(name)

    def listed_tool(self, turn: AgentTurn, name: str) -> Tool | None:
        """The tool of one of the agent's toolsets that `turn` was shown under `name`, or None.

        None too when the toolset that listed it is no longer one of the agent's.
        """
        listed = next((t for t in turn.listed_tools or () if t.name == name), None)
        toolset = None if listed is None else self._toolsets.get(listed.toolset)
        return None if toolset is None or listed is None else toolset.tool(listed)

    def masked_arguments(self, call: ToolCall) -> dict[str, Any]:
        """The call's arguments as a page may show them: values its tool marks sensitive replaced by `"***"`.

        A call of a tool the agent does not have (the model made the name up) or of a
        sub-agent has nothing marked sensitive.
        """
        tool = self.tool(call.name)
        return dict(call.arguments) if tool is None else tool.masked_arguments(call.arguments)

    def sub_agent(self, name: str) -> Agent | None:
        """Return the sub-agent offered under this tool name, or None."""
        return self._sub_agents.get(name)

    @property
    def user_input_tool(self) -> AgentUserInputTool | None:
        """The agent's `request_user_input` tool, if it has one."""
        return next((t for t in self.tools if isinstance(t, AgentUserInputTool)), None)

    def tool_specs(self) -> list[ToolSpec]:
        """Specs of every tool and sub-agent, as sent to the model (computed once)."""
        if self._specs is not None:
            return self._specs
        specs = [t.spec for t in self._tools.values()]
        for sub in self.sub_agents:
            specs.append(
                ToolSpec(
                    name=sub.id,
                    description=sub.description or f"Delegate a task to the {sub.id} agent.",
                    parameters=DELEGATION_PARAMETERS,
                )
            )
        self._specs = specs
        return specs

    def walk(self) -> Iterable[Agent]:
        """This agent and, recursively, its sub-agents."""
        yield self
        for sub in self.sub_agents:
            yield from sub.walk()

    def __repr__(self) -> str:
        return f"Agent(id={self.id!r}, version={self.version!r})"


DELEGATION_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "The task for the sub-agent, self-contained."}},
    "required": ["task"],
    "additionalProperties": False,
}


class InMemoryAgentLoader:
    """An `AgentLoader` over agents registered in this process (sub-agents included)."""

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self._lock = threading.Lock()
        self._agents: dict[tuple[str, str], Agent] = {}
        self._latest: dict[str, Agent] = {}
        for agent in agents:
            self.register(agent)

    def register(self, agent: Agent) -> None:
        """Register an agent and its sub-agents; a later registration of the same id and version wins."""
        with self._lock:
            for item in agent.walk():
                self._agents[(item.id, item.version)] = item
                self._latest[item.id] = item

    def agents(self) -> list[Agent]:
        """Every registered agent (each version, sub-agents included), ordered by id and version."""
        with self._lock:
            return [self._agents[key] for key in sorted(self._agents)]

    def load(self, agent_id: str, version: str | None = None) -> Agent:
        """Return the agent; the most recently registered version when `version` is None."""
        with self._lock:
            agent = self._latest.get(agent_id) if version is None else self._agents.get((agent_id, str(version)))
        if agent is None:
            raise AgentNotFound(agent_id, version)
        return agent
