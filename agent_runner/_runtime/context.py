"""`RunnerContext`: the state a runner's collaborators share, and the execution mode they hand turns to."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from agent_runner._runtime.cancel_watch import CancelWatch
from agent_runner._runtime.conversations import ConversationGate
from agent_runner._runtime.projection import Projection
from agent_runner.agent import Agent
from agent_runner.events import AgentEventListener
from agent_runner.leasing import HeldLease
from agent_runner.middleware import Middleware
from agent_runner.model_limits import ModelLimiter
from agent_runner.persistence import AgentLoader, AgentTurnStore
from agent_runner.policy import AgentExecutionPolicy
from agent_runner.snapshot import AgentTurn

LeaseScope = Callable[[str], AbstractContextManager[HeldLease | None]]
"""Holds a turn's lease for the duration of a `with` block.

It yields the held lease, or None when another holder advanced the turn until it stopped
being runnable (so there is nothing left to step)."""


class Execution(Protocol):
    """Where turns that become runnable go: run in this thread, or handed to a dispatcher."""

    def dispatch(self, turn: AgentTurn) -> None:
        """A turn became runnable outside the calling thread's flow (started, resumed, a retry, a child)."""

    def children_waiting(self, parent: AgentTurn) -> AgentTurn:
        """The parent now waits for its children; return its latest snapshot."""

    def parent_resumed(self, parent: AgentTurn) -> None:
        """The parent's last child ended and made it runnable."""


@dataclass(eq=False)
class RunnerContext:
    """What the collaborators of one `AgentRunner` work with.

    Attributes:
        telemetry_key: The object telemetry hooks are registered under (the runner; see
            `agent_runner.telemetry_hooks.set_new_turn_hook`).
        local: Per-thread state: events carried to the next save, turns being driven.
        model_limiter: Decides when calls against shared model limits may go (None: no limits).
    """

    turn_store: AgentTurnStore
    agent_loader: AgentLoader
    policy: AgentExecutionPolicy
    middleware: list[Middleware]
    clock: Callable[[], datetime]
    lease_scope: LeaseScope | None
    gate: ConversationGate
    telemetry_key: object
    listeners: list[AgentEventListener] = field(default_factory=list)
    model_limiter: ModelLimiter | None = None
    local: threading.local = field(default_factory=threading.local)
    # Set right after construction: both call back into collaborators that take this context.
    projection: Projection = field(init=False)
    execution: Execution = field(init=False)
    cancel_watch: CancelWatch = field(init=False)

    def __post_init__(self) -> None:
        self.cancel_watch = CancelWatch(self.turn_store)

    def agent_for(self, turn: AgentTurn) -> Agent:
        """The agent definition of a turn, from the loader."""
        return self.agent_loader.load(turn.agent_id, turn.agent_version)
