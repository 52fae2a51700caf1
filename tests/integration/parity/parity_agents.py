"""Agents the parity tests run on both execution paths: embedded `AgentWorker` processes and Celery workers.

Both kinds of worker load this module by its package path (`--agents` and `--setup` of
`embedded_worker_main`, `AGENT_RUNNER_AGENT_LOADER` and `AGENT_RUNNER_SETUP` of Celery), so
they run exactly the same agents, tools and middleware.

A turn's user message is a JSON scenario such as `{"kind": "approval", "label": "approval"}`;
the scripted model plays it out from the messages the turn holds. Its tool call ids are made
from the label and the number of responses so far, so the same scenario gives the same ids
on every run and on both paths.

The test and the worker processes talk through a signals folder (`AGENT_RUNNER_TEST_SIGNALS`):
the tools write what they did as JSON lines (executions with their idempotency keys, side
effects, arrivals at a rendezvous), the middleware writes every step's outcome, and the test
opens gates (empty files) that held tools wait for.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_runner import (
    Agent,
    AgentRunner,
    AgentStepResult,
    AgentToolContext,
    AgentTurn,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    Middleware,
    RecoverableError,
    RetryPolicy,
    ToolCall,
    ToolError,
    VersionConflictError,
    tool,
)
from tests.helpers.jsonl import append_jsonl, read_jsonl
from tests.helpers.scenarios import opening

SIGNALS_VARIABLE = "AGENT_RUNNER_TEST_SIGNALS"
"""The environment variable naming the signals folder of the test."""
AGENT_ID = "parity-agent"
LOADER = f"{__name__}:build_loader"
"""`module:attribute` of the agents, for `AGENT_RUNNER_AGENT_LOADER` and `--agents`."""
SETUP = f"{__name__}:setup_runner"
"""`module:function` of the runner set-up, for `AGENT_RUNNER_SETUP` and `--setup`."""

RETRY_AFTER_S = 0.3
"""How long a recoverable failure of `flaky_write` asks to wait before the retry."""
WAIT_S = 30.0
"""Longest wait of a held tool for its gate, or of a rendezvous for its parties."""
RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.2, multiplier=1.0, jitter=0.0)
"""The parity agent's own retry schedule: both paths retry the same way whatever their runner's policy."""


@dataclass(frozen=True)
class Signals:
    """The folder the test and the worker processes share (see the module docstring)."""

    folder: Path

    @classmethod
    def of_this_process(cls) -> Signals:
        """The folder named by `AGENT_RUNNER_TEST_SIGNALS`."""
        return cls(Path(os.environ[SIGNALS_VARIABLE]))

    @property
    def executions(self) -> Path:
        """One line per tool execution: `key` (idempotency key), `tool`, `attempt` (1-based, per key), `pid`."""
        return self.folder / "executions.jsonl"

    @property
    def effects(self) -> Path:
        """One line per side effect made: `key`, `effect`, `attempt`, `pid`."""
        return self.folder / "effects.jsonl"

    @property
    def steps(self) -> Path:
        """One line per runner step: `turn`, `pid`, `version` before it, and its `outcome` (see `StepRecorder`)."""
        return self.folder / "steps.jsonl"

    def _gate(self, name: str) -> Path:
        return self.folder / f"gate-{name}"

    def open_gate(self, name: str) -> None:
        """Let the tools held at gate `name` go on."""
        self._gate(name).touch()

    @property
    def _every_gate(self) -> Path:
        return self.folder / "every-gate-open"

    def open_every_gate(self) -> None:
        """Let every held tool go on, now and later (a test on its way out)."""
        self._every_gate.touch()

    def wait_at_gate(self, name: str) -> None:
        """Block until the gate `name` is open.

        Raises:
            RuntimeError: It stayed closed for `WAIT_S` (the turn fails: the test lost track).
        """
        deadline = time.monotonic() + WAIT_S
        while not (self._gate(name).exists() or self._every_gate.exists()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"gate {name!r} stayed closed for {WAIT_S}s")
            time.sleep(0.02)


# --- Tools ------------------------------------------------------------------------------------


def _execution(tool_name: str) -> tuple[str, int]:
    """Record one execution of the current tool call; its idempotency key and attempt number."""
    signals = Signals.of_this_process()
    key = AgentToolContext.current().get_idempotency_key()
    attempt = 1 + sum(1 for record in read_jsonl(signals.executions) if record["key"] == key)
    append_jsonl(signals.executions, {"key": key, "tool": tool_name, "attempt": attempt, "pid": os.getpid()})
    return key, attempt


def _effect(key: str, effect: str, attempt: int) -> None:
    """Make the side effect `effect`: a ledger that dedupes on `key` would apply it once."""
    record = {"key": key, "effect": effect, "attempt": attempt, "pid": os.getpid()}
    append_jsonl(Signals.of_this_process().effects, record)


@tool
def write(effect: str) -> str:
    """Make one side effect."""
    key, attempt = _execution("write")
    _effect(key, effect, attempt)
    return f"wrote {effect}"


@tool(requires_approval=True)
def approved_write(effect: str) -> str:
    """Make one side effect, once a person approved it."""
    key, attempt = _execution("approved_write")
    _effect(key, effect, attempt)
    return f"wrote {effect}"


@tool
def flaky_write(effect: str, failures: int) -> str:
    """Fail recoverably on the first `failures` attempts of the call, then make the side effect."""
    key, attempt = _execution("flaky_write")
    if attempt <= failures:
        raise RecoverableError(f"{effect} is busy on attempt {attempt}", retry_after=RETRY_AFTER_S)
    _effect(key, effect, attempt)
    return f"wrote {effect} on attempt {attempt}"


@tool
def held_write(effect: str, gate: str) -> str:
    """On the call's first execution, wait until the test opens `gate`; then make the side effect.

    A later execution of the same call (another worker took the turn over) does not wait.
    """
    key, attempt = _execution("held_write")
    if attempt == 1:
        Signals.of_this_process().wait_at_gate(gate)
    _effect(key, effect, attempt)
    return f"wrote {effect} on attempt {attempt}"


@tool
def rendezvous(barrier: str, parties: int) -> str:
    """Wait until `parties` calls have reached `barrier`, which they can only do running at the same time."""
    signals = Signals.of_this_process()
    _execution("rendezvous")
    arrivals = signals.folder / f"rendezvous-{barrier}.jsonl"
    append_jsonl(arrivals, {"pid": os.getpid()})
    deadline = time.monotonic() + WAIT_S
    while (arrived := len(read_jsonl(arrivals))) < parties:
        if time.monotonic() > deadline:
            raise ToolError(f"only {arrived} of {parties} calls reached {barrier} within {WAIT_S}s")
        time.sleep(0.02)
    return f"{parties} calls met at {barrier}"


# --- The scripted model -----------------------------------------------------------------------

Round = list[tuple[str, dict[str, Any]]]
"""The tool calls of one model response: (tool name, arguments)."""


def _rounds(spec: dict[str, Any]) -> list[Round]:
    """The tool calls the model makes for the scenario `spec`, one list per response."""
    label: str = spec["label"]
    match spec["kind"]:
        case "approval":
            return [
                [("approved_write", {"effect": f"{label}:first"})],
                [("approved_write", {"effect": f"{label}:second"})],
            ]
        case "retry":
            return [[("flaky_write", {"effect": f"{label}:flaky", "failures": 1})]]
        case "fanout":
            tasks = {
                agent_id: json.dumps({"kind": "meet", "label": f"{label}.{agent_id}", "barrier": label, "parties": 2})
                for agent_id in ("scout", "scribe")
            }
            return [[(agent_id, {"task": task}) for agent_id, task in tasks.items()]]
        case "meet":
            return [[("rendezvous", {"barrier": spec["barrier"], "parties": spec["parties"]})]]
        case "cancel":
            return [
                [("held_write", {"effect": f"{label}:held", "gate": label}), ("write", {"effect": f"{label}:next"})]
            ]
        case "takeover":
            return [[("held_write", {"effect": f"{label}:held", "gate": label})]]
    raise ValueError(f"unknown scenario kind {spec['kind']!r}")


class ScenarioModel:
    """A chat model that plays the scenario of the turn's last user message."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        """The next round of tool calls of the scenario, or the final answer once they are all answered."""
        turn = opening(request)
        spec = json.loads(turn.text)
        responses = turn.responses
        rounds = _rounds(spec)
        if responses < len(rounds):
            calls = [
                ToolCall(id=f"{spec['label']}-{responses}-{index}", name=name, arguments=arguments)
                for index, (name, arguments) in enumerate(rounds[responses])
            ]
            return ChatResponse(message=AiMessage(tool_calls=calls))
        return ChatResponse(message=AiMessage(content=f"done:{spec['label']}"))


def build_agents() -> list[Agent]:
    """The parity agent, with two sub-agents it can delegate to at once."""
    model = ScenarioModel()
    sub_agents = [
        Agent(
            id=agent_id, description=f"The {agent_id}: meets the other sub-agent.", chat_model=model, tools=[rendezvous]
        )
        for agent_id in ("scout", "scribe")
    ]
    parity = Agent(
        id=AGENT_ID,
        chat_model=model,
        tools=[write, approved_write, flaky_write, held_write],
        sub_agents=sub_agents,
        retry=RETRY,
    )
    return [parity]


def build_loader() -> InMemoryAgentLoader:
    """Entry point named by `LOADER`."""
    return InMemoryAgentLoader(build_agents())


# --- Step outcomes ----------------------------------------------------------------------------


class StepRecorder(Middleware):
    """Writes the outcome of every step to the signals folder: `saved`, `conflict` or `raised:<error type>`.

    A step whose save was refused because another worker moved the turn on shows up as
    `conflict` (its version was overtaken) or `raised:LeaseLostError` (its fence was).
    """

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        """Run the step and record what became of it."""
        record: dict[str, Any] = {"turn": turn.id, "pid": os.getpid(), "version": turn.version}
        try:
            result = call_next(turn)
        except Exception as exc:
            record["outcome"] = f"raised:{type(exc).__name__}"
            raise
        else:
            record["outcome"] = "conflict" if isinstance(result.error, VersionConflictError) else "saved"
            record["saved_version"] = result.turn.version
            return result
        finally:
            append_jsonl(Signals.of_this_process().steps, record)


def setup_runner(runner: AgentRunner) -> None:
    """Entry point named by `SETUP`: every runner of a worker records its steps."""
    runner.middleware.append(StepRecorder())
