"""The agent of the steering tests: a model that takes seconds per call and records what each request held.

A turn's first user message is its script, for example
`{"label": "a", "rounds": 1, "gates": "/tmp/x"}`: the first `rounds` answers call the
`work` tool and the next one answers `done:<label>`. With `gates`, each model call and each
tool call lasts until the test opens it: model call n waits for the file
`<gates>/<label>-model-<n>`, tool call n for `<gates>/<label>-tool-<n>` (a slow provider
and a slow tool whose length the test decides). Every request is written to
`steer_requests` in the test's schema (`AGENT_RUNNER_TEST_LEDGER_URL`) before the wait, so
the test sees when a call is under way and what it held. With `TEST_PAUSE_AT=steer-model`
the first call of each turn is held there for the test to kill its process. With
`"crash": true` the model's first answer has some text and calls `crash_worker`, which
SIGKILLs the process that runs it, every time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import sqlalchemy as sa

from agent_runner import (
    Agent,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    ModelMessage,
    ToolMessage,
    UserMessage,
    tool,
)
from tests.helpers.crash import pause_this_process_once
from tests.helpers.scenarios import fresh_call
from tests.integration.celery_workers.celery_agents import ledger_engine

PAUSE_POINT = "steer-model"
"""Where a model call is held for the test to kill its process (`TEST_PAUSE_AT`)."""

CREATE_REQUESTS = sa.text(
    "CREATE TABLE steer_requests (id SERIAL PRIMARY KEY, label TEXT NOT NULL, body TEXT NOT NULL)"
)
"""One row per model request: its turn's label, and `{"answered": model answers before it, "messages": [...]}`."""
_RECORD = sa.text("INSERT INTO steer_requests (label, body) VALUES (:label, :body)")
READ_REQUESTS = sa.text("SELECT body FROM steer_requests WHERE label = :label ORDER BY id")


def shown(message: ModelMessage) -> list[Any]:
    """A request's message as the test reads it: its role, and its text or call ids."""
    if isinstance(message, AiMessage):
        return ["ai", message.content, [c.id for c in message.tool_calls]]
    if isinstance(message, ToolMessage):
        return ["tool", message.tool_call_id]
    if isinstance(message, UserMessage):
        return ["user", message.content]
    return ["system", ""]


GATE_LIMIT_S = 120.0
"""Longest a call waits for its gate before it fails (the test lost track)."""


def wait_for_gate(path: str) -> None:
    """Return once the file `path` exists."""
    deadline = time.monotonic() + GATE_LIMIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"nobody opened {path} within {GATE_LIMIT_S} s")
        time.sleep(0.02)


@tool
def work(gate: str) -> str:
    """Work until the gate opens, like a slow external call."""
    if gate:
        wait_for_gate(gate)
    return "worked"


@tool
def crash_worker() -> str:
    """Take the worker down, like a tool that runs it out of memory."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


class RecordingModel:
    """Plays the script of the turn's first user message, slowly, recording each request."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Record the request, wait, then answer the script's next round."""
        first = next(m for m in request.messages if isinstance(m, UserMessage))
        spec = json.loads(first.content)
        label = spec["label"]
        answered = sum(1 for m in request.messages if isinstance(m, AiMessage))
        body = {"answered": answered, "messages": [shown(m) for m in request.messages]}
        row = {"label": label, "body": json.dumps(body)}
        with ledger_engine().begin() as connection:
            connection.execute(_RECORD, row)
        pause_this_process_once(PAUSE_POINT, f"{label}-{answered}")
        if spec.get("crash"):
            return ChatResponse(message=AiMessage("Checked 3 of 5 servers.", [fresh_call("crash_worker")]))
        gates = spec.get("gates")
        if gates:
            wait_for_gate(os.path.join(gates, f"{label}-model-{answered}"))
        if answered < int(spec.get("rounds", 0)):
            gate = os.path.join(gates, f"{label}-tool-{answered}") if gates else ""
            return ChatResponse(message=AiMessage(tool_calls=[fresh_call("work", gate=gate)]))
        return ChatResponse(message=AiMessage(content=f"done:{label}"))


def build_loader() -> InMemoryAgentLoader:
    """Entry point for `AGENT_RUNNER_AGENT_LOADER=tests.integration.celery_workers.steering_agents:build_loader`."""
    return InMemoryAgentLoader(
        [Agent(id="steered", chat_model=RecordingModel(), tools=[work, crash_worker], max_iterations=10)]
    )
