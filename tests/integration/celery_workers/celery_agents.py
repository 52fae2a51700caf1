"""Agents that the Celery worker processes of these tests load through `AGENT_RUNNER_AGENT_LOADER`.

A turn's user message is a JSON scenario, for example `{"kind": "approval", "label": "t7"}`;
the scripted model reads it and plays the scenario out from what the turn has seen so far,
so any worker process can take over any turn at any point. Tool call ids are random: if a
crash made the runner ask the model again after a tool had run, the new call would carry a
new idempotency key, and the ledger would show the same effect twice.

Side effects go to a ledger table in the test's own database schema
(`AGENT_RUNNER_TEST_LEDGER_URL`), keyed by the tool idempotency key, the way a real
idempotent API dedupes on it: `executions` counts how often a call ran, `effect` names what
the scenario meant to do once.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import sqlalchemy as sa

from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentToolContext,
    AgentUserInputTool,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    RecoverableError,
    ToolCall,
    ToolMessage,
    tool,
)
from tests.helpers.scenarios import fresh_call, opening

LEDGER_URL_VARIABLE = "AGENT_RUNNER_TEST_LEDGER_URL"

metadata = sa.MetaData()
ledger = sa.Table(
    "test_ledger",
    metadata,
    sa.Column("idempotency_key", sa.String, primary_key=True),
    sa.Column("turn_id", sa.String, nullable=False),
    sa.Column("effect", sa.String, nullable=False),
    sa.Column("executions", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)
attempts = sa.Table(
    "test_attempts",
    metadata,
    sa.Column("idempotency_key", sa.String, primary_key=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("last_at", sa.Float, nullable=False),
)

DETAILS_FORM = AgentFormDefinition(
    key="details",
    description="Ask for the value the scenario needs.",
    schema={
        "type": "object",
        "properties": {"value": {"type": "string", "minLength": 1}},
        "required": ["value"],
        "additionalProperties": False,
    },
)

_engine_lock = threading.Lock()
_engine: tuple[int, str, sa.Engine] | None = None


def ledger_engine() -> sa.Engine:
    """The ledger database of this process (rebuilt after a fork, or when the test points elsewhere)."""
    global _engine
    url = os.environ[LEDGER_URL_VARIABLE]
    with _engine_lock:
        if _engine is None or _engine[:2] != (os.getpid(), url):
            if _engine is not None and _engine[0] == os.getpid():
                _engine[2].dispose()
            _engine = (os.getpid(), url, sa.create_engine(url, pool_size=2))
        return _engine[2]


def dispose_ledger_engine() -> None:
    """Close this process's ledger connections (the test process, between tests)."""
    global _engine
    with _engine_lock:
        if _engine is not None and _engine[0] == os.getpid():
            _engine[2].dispose()
        _engine = None


def _record_effect(effect: str) -> str:
    context = AgentToolContext.current()
    key = context.get_idempotency_key()
    statement = sa.text(
        "INSERT INTO test_ledger (idempotency_key, turn_id, effect, executions, pid) "
        "VALUES (:key, :turn_id, :effect, 1, :pid) "
        "ON CONFLICT (idempotency_key) DO UPDATE SET executions = test_ledger.executions + 1"
    )
    with ledger_engine().begin() as connection:
        connection.execute(statement, {"key": key, "turn_id": context.turn_id, "effect": effect, "pid": os.getpid()})
    return f"ok:{effect}"


def _count_attempt() -> int:
    key = AgentToolContext.current().get_idempotency_key()
    statement = sa.text(
        "INSERT INTO test_attempts (idempotency_key, attempts, last_at) VALUES (:key, 1, :now) "
        "ON CONFLICT (idempotency_key) DO UPDATE SET attempts = test_attempts.attempts + 1, last_at = :now "
        "RETURNING attempts"
    )
    with ledger_engine().begin() as connection:
        return int(connection.execute(statement, {"key": key, "now": time.time()}).scalar_one())


@tool
def ledger_write(effect: str) -> str:
    """Write one side effect to the ledger."""
    return _record_effect(effect)


@tool(requires_approval=True)
def approved_write(effect: str) -> str:
    """Write one side effect to the ledger, after a person approved it."""
    return _record_effect(effect)


@tool
def flaky_write(effect: str, failures: int, retry_after: float = 0.0) -> str:
    """Fail recoverably `failures` times, then write the side effect."""
    if _count_attempt() <= failures:
        raise RecoverableError(f"{effect} is not available yet", retry_after=retry_after or None)
    return _record_effect(effect)


@tool
def slow_write(effect: str, seconds: float) -> str:
    """Take `seconds` (a long external call), then write the side effect."""
    time.sleep(seconds)
    return _record_effect(effect)


@tool(requires_approval=True)
def approved_whoami() -> str:
    """Answer with whom the call acts for, as the tool context tells it."""
    context = AgentToolContext.current()
    approval = context.approval
    return json.dumps(
        {
            "metadata": dict(context.metadata),
            "conversation_id": context.conversation_id,
            "tenant_id": context.tenant_id,
            "approval": None
            if approval is None
            else {"by": approval.decided_by, "at": approval.decided_at.isoformat(), "reason": approval.reason},
        }
    )


def _rounds(spec: dict[str, Any], results: list[ToolMessage]) -> list[list[ToolCall]]:
    """The tool calls the model makes, one list per model response, for the scenario `spec`."""
    label = spec["label"]
    kind = spec["kind"]
    if kind == "plain":
        return []
    if kind == "steps":
        return [[fresh_call("ledger_write", effect=f"{label}:w{i}")] for i in range(int(spec.get("steps", 3)))]
    if kind == "approval":
        return [[fresh_call("approved_write", effect=f"{label}:approved")]]
    if kind == "form":
        value = json.loads(results[0].content)["value"] if results else ""
        return [
            [fresh_call("request_user_input", formKey="details")],
            [fresh_call("ledger_write", effect=f"{label}:{value}")],
        ]
    if kind == "retry":
        failures = int(spec.get("failures", 2))
        return [
            [fresh_call("flaky_write", effect=f"{label}:flaky", failures=failures, retry_after=spec.get("after", 0))]
        ]
    if kind == "slow":
        return [[fresh_call("slow_write", effect=f"{label}:s{i}", seconds=spec.get("seconds", 0.3))] for i in range(3)]
    if kind == "fanout":
        children = int(spec.get("children", 3))
        tasks = [json.dumps({"kind": "steps", "label": f"{label}.c{i}", "steps": 1}) for i in range(children)]
        return [[fresh_call("part-worker", task=task) for task in tasks]]
    if kind == "inbox":
        return [[fresh_call("ledger_write", effect=f"inbox:{label}")]]
    if kind == "whoami":
        return [[fresh_call("approved_whoami")]]
    if kind == "fail":
        raise ValueError(f"{label} fails on purpose")
    raise ValueError(f"unknown scenario kind {kind!r}")


class ScenarioModel:
    """A chat model that plays the scenario in the turn's last user message."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Answer with the next round of tool calls of the scenario, or the final answer."""
        turn = opening(request)
        spec = _spec(turn.text)
        responses = turn.responses
        rounds = _rounds(spec, turn.results)
        if responses < len(rounds):
            return ChatResponse(message=AiMessage(tool_calls=rounds[responses]))
        return ChatResponse(message=AiMessage(content=f"done:{spec['label']}"))


def _spec(content: str) -> dict[str, Any]:
    try:
        spec = json.loads(content)
    except json.JSONDecodeError:
        spec = None
    if not isinstance(spec, dict):
        # A plain inbox message: the text is the label.
        return {"kind": "inbox", "label": content}
    return spec


def build_agents() -> list[Agent]:
    """The worker agent (with its sub-agent for parts of a task) and the inbox agent."""
    model = ScenarioModel()
    part = Agent(id="part-worker", description="Runs one part of a task.", chat_model=model, tools=[ledger_write])
    worker = Agent(
        id="worker-agent",
        chat_model=model,
        tools=[
            AgentUserInputTool(forms=[DETAILS_FORM]),
            ledger_write,
            approved_write,
            flaky_write,
            slow_write,
            approved_whoami,
        ],
        sub_agents=[part],
        max_iterations=20,
    )
    inbox = Agent(id="inbox-agent", chat_model=model, tools=[ledger_write])
    return [worker, inbox]


def build_loader() -> InMemoryAgentLoader:
    """Entry point for `AGENT_RUNNER_AGENT_LOADER=tests.integration.celery_workers.celery_agents:build_loader`."""
    return InMemoryAgentLoader(build_agents())
