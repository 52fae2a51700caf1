"""The agents the worker processes of the telemetry tests load (`tests.integration.telemetry.telemetry_agents:build_loader`).

The `tour` agent plays one turn through everything a trace must follow: a form, a tool
call that needs approval, a tool call that fails once and is retried, and two child
turns delegated to the `part-worker` sub-agent, then it answers. Its model reads the turn
so far, so any worker process can take any step. The tools are those of the Celery worker
tests (`celery_agents`), with their ledger of side effects.
"""

from __future__ import annotations

import json

from agent_runner import (
    Agent,
    AgentUserInputTool,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    ToolMessage,
    Usage,
    UserMessage,
)
from tests.helpers.scenarios import fresh_call
from tests.integration.celery_workers.celery_agents import DETAILS_FORM, approved_write, flaky_write, ledger_write

MODEL_NAME = "tour-model-1"
USAGE = Usage(input_tokens=20, output_tokens=4)
CHILDREN = 2


class TourModel:
    """Plays the tour (root turns) or one ledger write (child turns), from what the turn has seen."""

    model = MODEL_NAME

    def generate(self, request: ChatRequest) -> ChatResponse:
        """The next response of the scenario."""
        messages = request.messages
        start = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
        task = messages[start].content or ""
        since = messages[start + 1 :]
        responses = sum(1 for m in since if isinstance(m, AiMessage))
        results = [m for m in since if isinstance(m, ToolMessage)]
        if task.startswith("part:"):
            rounds = [[fresh_call("ledger_write", effect=task)]]
        else:
            label = task
            value = json.loads(results[0].content)["value"] if results else ""
            rounds = [
                [fresh_call("request_user_input", formKey=DETAILS_FORM.key)],
                [fresh_call("approved_write", effect=f"{label}:approved:{value}")],
                [fresh_call("flaky_write", effect=f"{label}:flaky", failures=1)],
                [fresh_call("part-worker", task=f"part:{label}:{i}") for i in range(CHILDREN)],
            ]
        if responses < len(rounds):
            return ChatResponse(message=AiMessage(tool_calls=rounds[responses]), usage=USAGE)
        return ChatResponse(message=AiMessage(content=f"done:{task}"), usage=USAGE)


def build_agents() -> list[Agent]:
    """The tour agent and its sub-agent."""
    model = TourModel()
    part = Agent(id="part-worker", description="Writes one part.", chat_model=model, tools=[ledger_write])
    tour = Agent(
        id="tour",
        chat_model=model,
        tools=[AgentUserInputTool(forms=[DETAILS_FORM]), approved_write, flaky_write, ledger_write],
        sub_agents=[part],
        max_iterations=20,
    )
    return [tour]


def build_loader() -> InMemoryAgentLoader:
    """Entry point for `AGENT_RUNNER_AGENT_LOADER=telemetry_agents:build_loader`."""
    return InMemoryAgentLoader(build_agents())
