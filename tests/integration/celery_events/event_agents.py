"""Agents with a streaming model, loaded by the Celery worker processes of the event tests.

The worker processes load them through
`AGENT_RUNNER_AGENT_LOADER=tests.integration.celery_events.event_agents:build_loader`.
As in `tests.integration.celery_workers.celery_agents`, a turn's user message is a JSON
scenario the model plays out from what the turn has seen so far, so any worker can take
over any turn at any point. Every answer is streamed: the model passes a few chunks to
`ChatRequest.on_delta` and answers with their concatenation as the message text, so a
reader can match each model call's MODEL_DELTA events with its MODEL_RESPONSE.

Scenarios (`{"kind": ..., "label": ...}`):

- `tour`: a form, an approved tool call, a tool that fails once and is retried, two
  parallel child turns, then the final answer.
- `slow`: a slow tool call (`marked_slow_write`, which records each start and is slow only
  the first time), two parallel child turns, then the final answer.
- `steps`: `steps` plain tool calls (the children's scenario), then the final answer.
- `plain`: the final answer at once.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import sqlalchemy as sa

from agent_runner import (
    Agent,
    AgentToolContext,
    AgentUserInputTool,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    ToolCall,
    tool,
)
from tests.helpers.scenarios import fresh_call, opening
from tests.integration.celery_workers.celery_agents import (
    DETAILS_FORM,
    approved_write,
    flaky_write,
    ledger_engine,
    ledger_write,
)

AGENT_ID = "event-agent"
PART_AGENT_ID = "event-part"
CHUNKS_PER_ANSWER = 3

metadata = sa.MetaData()
tool_starts = sa.Table(
    "test_tool_starts",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("idempotency_key", sa.String, nullable=False),
    sa.Column("effect", sa.String, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)


@tool
def marked_slow_write(effect: str, seconds: float) -> str:
    """Record that the call started (and in which process), then write the side effect.

    The first start of a call takes `seconds` (long enough for a test to kill the worker
    inside it, however busy the machine); a call started again after that answers at once.
    """
    key = AgentToolContext.current().get_idempotency_key()
    with ledger_engine().begin() as connection:
        connection.execute(sa.insert(tool_starts).values(idempotency_key=key, effect=effect, pid=os.getpid()))
        starts = connection.execute(
            sa.select(sa.func.count()).select_from(tool_starts).where(tool_starts.c.idempotency_key == key)
        ).scalar_one()
    if starts == 1:
        time.sleep(seconds)
    return str(ledger_write.invoke({"effect": effect}))


def _children(label: str) -> list[ToolCall]:
    tasks = [json.dumps({"kind": "steps", "label": f"{label}.c{i}", "steps": 1}) for i in range(2)]
    return [fresh_call(PART_AGENT_ID, task=task) for task in tasks]


def _rounds(spec: dict[str, Any]) -> list[list[ToolCall]]:
    """The tool calls the model makes, one list per model response, for the scenario `spec`."""
    label = spec["label"]
    kind = spec["kind"]
    if kind == "plain":
        return []
    if kind == "steps":
        return [[fresh_call("ledger_write", effect=f"{label}:w{i}")] for i in range(int(spec.get("steps", 1)))]
    if kind == "tour":
        return [
            [fresh_call("request_user_input", formKey=DETAILS_FORM.key)],
            [fresh_call("approved_write", effect=f"{label}:approved")],
            [fresh_call("flaky_write", effect=f"{label}:flaky", failures=1, retry_after=0.2)],
            _children(label),
        ]
    if kind == "slow":
        return [
            [fresh_call("marked_slow_write", effect=f"{label}:slow", seconds=spec.get("seconds", 30.0))],
            _children(label),
        ]
    raise ValueError(f"unknown scenario kind {kind!r}")


def answer_chunks(label: str, answer: int) -> list[str]:
    """The text deltas of the `answer`-th model response (from 0) of the turn whose scenario is `label`."""
    return [f"<{label} a{answer} {k}/{CHUNKS_PER_ANSWER}>" for k in range(CHUNKS_PER_ANSWER)]


class StreamingScenarioModel:
    """A chat model that plays the scenario in the turn's last user message and streams every answer."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Stream the next answer of the scenario through `request.on_delta`, then return it whole."""
        turn = opening(request)
        spec = json.loads(turn.text)
        answer = turn.responses
        rounds = _rounds(spec)
        chunks = answer_chunks(spec["label"], answer)
        for chunk in chunks:
            if request.on_delta is not None:
                request.on_delta(chunk)
            time.sleep(0.005)  # a token stream takes time: deltas get distinct timestamps
        calls = rounds[answer] if answer < len(rounds) else []
        return ChatResponse(message=AiMessage(content="".join(chunks), tool_calls=calls))


def build_agents() -> list[Agent]:
    """The event agent, with its sub-agent for the parts of a task."""
    model = StreamingScenarioModel()
    part = Agent(id=PART_AGENT_ID, description="Runs one part of a task.", chat_model=model, tools=[ledger_write])
    agent = Agent(
        id=AGENT_ID,
        chat_model=model,
        tools=[AgentUserInputTool(forms=[DETAILS_FORM]), ledger_write, approved_write, flaky_write, marked_slow_write],
        sub_agents=[part],
        max_iterations=20,
    )
    return [agent]


def build_loader() -> InMemoryAgentLoader:
    """Entry point for `AGENT_RUNNER_AGENT_LOADER=tests.integration.celery_events.event_agents:build_loader`."""
    return InMemoryAgentLoader(build_agents())
