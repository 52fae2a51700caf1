"""Agents, tools and process handling shared by the embedded worker integration tests.

The same module is imported by the test process (to start turns and check them) and by
the worker processes that `embedded_worker_main` runs, so both sides know the agents.
Tools and the step log write JSON lines to files: they survive a SIGKILL of the writer
(each line is flushed to the OS as soon as it is written) and need no database of their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agent_runner import (
    Agent,
    AgentStepResult,
    AgentToolContext,
    AgentTurn,
    AgentTurnStatus,
    AgentTurnStore,
    AiMessage,
    InMemoryAgentLoader,
    Middleware,
    ToolMessage,
    tool,
)
from tests.helpers.jsonl import append_jsonl, read_jsonl
from tests.helpers.processes import with_tests_importable
from tests.helpers.scenarios import looping_model

MAIN_MODULE = f"{__package__}.embedded_worker_main"
"""The module a worker process runs (with `python -m`)."""
SLOW_ONCE_S = 60.0
"""How long the first execution of `slow_once` lasts: far longer than any test waits."""

T = TypeVar("T")

_ledger: Path | None = None


def configure(ledger: Path | None) -> None:
    """Set the file the tools record their executions in."""
    global _ledger
    _ledger = ledger


# --- Agents -----------------------------------------------------------------------------------


@tool
def fast(n: int) -> str:
    """A quick lookup."""
    return f"fast {n}"


@tool
def pause(n: int) -> str:
    """Takes a moment, like a slow API."""
    time.sleep(0.3)
    if _ledger is not None:
        append_jsonl(_ledger, {"key": AgentToolContext.current().get_idempotency_key(), "pid": os.getpid()})
    return f"paused {n}"


@tool
def slow_once(n: int) -> str:
    """Hangs on its first execution for a call, returns at once when re-executed."""
    assert _ledger is not None, "configure(ledger) first"
    key = AgentToolContext.current().get_idempotency_key()
    earlier = [r for r in read_jsonl(_ledger) if r["key"] == key]
    append_jsonl(_ledger, {"key": key, "pid": os.getpid(), "at": time.time()})
    if not earlier:
        time.sleep(SLOW_ONCE_S)  # the test kills this process meanwhile
    return f"done by {os.getpid()}"


def loader() -> InMemoryAgentLoader:
    """Every agent of these tests."""
    return InMemoryAgentLoader(
        [
            Agent(id="looper", chat_model=looping_model("fast", 2), tools=[fast]),
            Agent(id="pauser", chat_model=looping_model("pause", 3), tools=[pause]),
            Agent(id="slow-once", chat_model=looping_model("slow_once", 1), tools=[slow_once]),
        ]
    )


LOOPER_STEPS = 5
"""Steps of a `looper` turn: model, tool, model, tool, final model."""


# --- Step intervals ---------------------------------------------------------------------------


class StepLog(Middleware):
    """Records `[start, end)` of every step, per turn, as JSON lines in a file of this process."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"steps-{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        start = time.time()
        try:
            return call_next(turn)
        finally:
            record = {"turn": turn.id, "pid": os.getpid(), "start": start, "end": time.time()}
            with self._lock:
                append_jsonl(self.path, record)


def overlapping_steps(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of steps of one turn whose intervals overlap."""
    by_turn: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_turn[record["turn"]].append(record)
    found = []
    for steps in by_turn.values():
        steps.sort(key=lambda r: r["start"])
        found += [(a, b) for a, b in zip(steps, steps[1:], strict=False) if b["start"] < a["end"]]
    return found


# --- Checks -----------------------------------------------------------------------------------


def history_problems(turn: AgentTurn) -> list[str]:
    """Lost, duplicated or unanswered messages in a finished turn's history."""
    problems: list[str] = []
    ids = [m.id for m in turn.messages]
    if len(ids) != len(set(ids)):
        problems.append(f"duplicate message ids in {ids}")
    calls = [c.id for m in turn.messages if isinstance(m, AiMessage) for c in m.tool_calls]
    answers = [m.tool_call_id for m in turn.messages if isinstance(m, ToolMessage)]
    if len(calls) != len(set(calls)):
        problems.append(f"tool call ids used twice: {calls}")
    if sorted(answers) != sorted(calls):
        problems.append(f"tool calls {calls} answered by {answers}")
    for earlier, later in zip(turn.messages, turn.messages[1:], strict=False):
        if isinstance(later, ToolMessage) and not isinstance(earlier, AiMessage | ToolMessage):
            problems.append(f"ToolMessage {later.id} follows a {earlier.role} message")
    return problems


def turn_with_status(turns: AgentTurnStore, turn_id: str, status: AgentTurnStatus) -> Callable[[], AgentTurn | None]:
    """A probe for `wait_for`: the turn once it has `status`, None before."""

    def probe() -> AgentTurn | None:
        turn = turns.load(turn_id)
        return turn if turn.status is status else None

    return probe


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# --- Worker processes -------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    """An `AgentWorker` in a process of its own, started by `spawn_worker`."""

    name: str
    process: subprocess.Popen[bytes]
    ready_file: Path
    log_file: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.name} was not ready after {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: the process dies at once, mid-step, without releasing anything."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (the worker stops after its steps in flight), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(10)
        return self.process.returncode

    def log(self) -> str:
        return self.log_file.read_text(encoding="utf-8", errors="replace") if self.log_file.exists() else ""


def spawn_worker(
    folder: Path,
    name: str,
    database_url: str,
    *,
    lease: str = "sql",
    redis_url: str | None = None,
    redis_prefix: str | None = None,
    lease_ttl: float = 10.0,
    concurrency: int = 1,
    poll_interval: float = 0.05,
    ledger: Path | None = None,
    step_log: Path | None = None,
    agents: str | None = None,
    setup: str | None = None,
    env: Mapping[str, str] | None = None,
) -> WorkerProcess:
    """Start `embedded_worker_main` in a process group of its own; stop it with `stop` or `kill` in a `finally`.

    `agents` and `setup` name the agent loader and the runner set-up by `module:attribute`
    (default: this module's agents, no set-up); `env` adds variables to the process's environment.
    """
    ready = folder / f"ready-{name}"
    log_file = folder / f"worker-{name}.log"
    args = [sys.executable, "-m", MAIN_MODULE, "--database-url", database_url, "--lease", lease]
    args += ["--lease-ttl", str(lease_ttl), "--concurrency", str(concurrency), "--poll-interval", str(poll_interval)]
    args += ["--ready-file", str(ready)]
    if redis_url is not None:
        args += ["--redis-url", redis_url, "--redis-prefix", redis_prefix or ""]
    if ledger is not None:
        args += ["--ledger", str(ledger)]
    if step_log is not None:
        args += ["--step-log", str(step_log)]
    if agents is not None:
        args += ["--agents", agents]
    if setup is not None:
        args += ["--setup", setup]
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            args,
            env=with_tests_importable({**os.environ, **(env or {})}),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return WorkerProcess(name, process, ready, log_file)


@dataclass
class CommandWorker:
    """An `agent-runner worker` process, started by `spawn_command_worker`."""

    name: str
    process: subprocess.Popen[bytes]
    log_file: Path

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait for the line the command prints once its threads are about to start."""
        wait_for(lambda: "stepping turns" in self.log() or self._exited(), timeout, f"worker {self.name} to start")
        assert self.process.poll() is None, f"worker {self.name} exited with {self.process.returncode}:\n{self.log()}"

    def _exited(self) -> bool:
        return self.process.poll() is not None

    def stop(self, timeout: float = 20.0, signum: int = signal.SIGINT) -> int:
        """Ctrl-C (SIGINT, or `signum`): the command stops its threads, steps in flight first; SIGKILL if it does not exit."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def log(self) -> str:
        return self.log_file.read_text(encoding="utf-8", errors="replace") if self.log_file.exists() else ""


def spawn_command_worker(
    folder: Path, name: str, database_url: str, env: Mapping[str, str] | None = None
) -> CommandWorker:
    """Start `agent-runner worker` on this module's agents, with only the `AGENT_RUNNER_` settings in `env`."""
    from tests.helpers.api_server import AGENT_RUNNER, server_env

    log_file = folder / f"command-worker-{name}.log"
    command = [AGENT_RUNNER, "--agents", f"{__name__}:loader", "worker", "--poll-interval", "0.05"]
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [*command, "--concurrency", "2", "--lease-ttl", "10"],
            env=server_env(database_url, **(env or {})),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return CommandWorker(name, process, log_file)
