"""`AgentRunner`: the shell around the pure state machine.

The runner performs what `machine.plan_step` decides (a model call, a tool call, a
suspension, child turns), folds the outcome in with the `machine.apply_*` functions,
saves every stable boundary with a compare-and-swap, projects new messages into the
conversation's ChatMemory and emits events. It keeps no turn state in its fields, so one
runner serves a whole application and any process can continue any turn.

This module is the public face only: the work is done in `agent_runner._runtime`, by
collaborators that share one `RunnerContext` per runner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from agent_runner._runtime import children, creation, delivery, endings, executing, resuming, saving, steering, stepping
from agent_runner._runtime.context import LeaseScope, RunnerContext
from agent_runner._runtime.conversations import ConversationGate
from agent_runner._runtime.execution import Dispatching, execution_mode
from agent_runner._runtime.pickup import Sighting
from agent_runner._runtime.projection import Projection
from agent_runner.agent import Agent, InMemoryAgentLoader
from agent_runner.errors import DefinitionError
from agent_runner.events import AgentEventListener
from agent_runner.ids import utcnow
from agent_runner.in_memory import InMemoryAgentTurnStore
from agent_runner.leasing import TurnHolder
from agent_runner.limits import check_id
from agent_runner.messages import ModelMessage, UserMessage
from agent_runner.middleware import Middleware
from agent_runner.model_limits import ModelLimiter
from agent_runner.persistence import AgentLoader, AgentTurnStore, ChatMemoryProvider, ConversationGuard, TurnDispatcher
from agent_runner.policy import AgentExecutionPolicy
from agent_runner.results import AdvanceResult, AgentStepResult, Delivery
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.suspensions import AgentResumeCommand, AgentSuspension

__all__ = ["AgentRunner", "AgentStepResult", "LeaseScope"]


class AgentRunner:
    """Runs agent turns as durable state machines.

    Args:
        turn_store: Where snapshots live (default: a new `InMemoryAgentTurnStore`).
        agent_loader: Finds agents by id and version for `restore` and for turns started by id
            (default: an `InMemoryAgentLoader`; agents passed to `run`/`start` are registered in it).
        chat_memory_provider: Maps a conversation id to its `ChatMemory`; needed for conversation turns.
        policy: Limits, retry schedule and close-out templates.
        middleware: Wrappers of model calls, tool calls and steps; the first is the outermost.
        dispatcher: When set, turns that become runnable outside the calling thread's flow (started,
            resumed with `submit_resume`, child turns, a parent whose last child ended) are handed to it
            instead of being run in this thread. Without one, the runner works inline: child turns run
            recursively in the thread that runs the parent.
        conversation_guard: A shared fast marker of active conversation turns (for example
            Redis); the turn store remains the truth.
        clock: Returns the current UTC time (tests may pass a fake clock).
        lease_scope: When set, `run`, `resume` and `run_until_blocked` step a turn only under its lease from
            this scope, its fence on every save (an `AgentWorker` sets it on the runner it serves).
        model_limiter: Decides when calls against shared provider limits may go; a call without capacity
            waits RETRY_SCHEDULED without using an attempt (see `agent_runner.model_limits`).
    """

    def __init__(
        self,
        turn_store: AgentTurnStore | None = None,
        agent_loader: AgentLoader | None = None,
        chat_memory_provider: ChatMemoryProvider | None = None,
        policy: AgentExecutionPolicy | None = None,
        middleware: Sequence[Middleware] = (),
        *,
        dispatcher: TurnDispatcher | None = None,
        conversation_guard: ConversationGuard | None = None,
        clock: Callable[[], datetime] = utcnow,
        lease_scope: LeaseScope | None = None,
        model_limiter: ModelLimiter | None = None,
    ) -> None:
        middleware = list(middleware)
        for item in middleware:
            if not isinstance(item, Middleware):
                raise DefinitionError(f"{item!r} is not a Middleware; subclass agent_runner.Middleware")
        store = turn_store if turn_store is not None else InMemoryAgentTurnStore()
        self._ctx = ctx = RunnerContext(
            turn_store=store,
            agent_loader=agent_loader if agent_loader is not None else InMemoryAgentLoader(),
            policy=policy if policy is not None else AgentExecutionPolicy(),
            middleware=middleware,
            clock=clock,
            lease_scope=lease_scope,
            gate=ConversationGate(store, conversation_guard),
            telemetry_key=self,  # telemetry hooks are registered per runner
            model_limiter=model_limiter,
        )
        ctx.projection = Projection(chat_memory_provider, partial(saving.projection_failed, ctx))
        ctx.execution = execution_mode(ctx, dispatcher)

    @property
    def turn_store(self) -> AgentTurnStore:
        """Where snapshots live."""
        return self._ctx.turn_store

    @property
    def agent_loader(self) -> AgentLoader:
        """Finds agents by id and version."""
        return self._ctx.agent_loader

    @property
    def policy(self) -> AgentExecutionPolicy:
        """Limits, retry schedule and close-out templates."""
        return self._ctx.policy

    @property
    def middleware(self) -> list[Middleware]:
        """Wrappers of model calls, tool calls and steps, the first outermost (a list: add to it in place)."""
        return self._ctx.middleware

    @property
    def clock(self) -> Callable[[], datetime]:
        """Returns the current UTC time."""
        return self._ctx.clock

    @property
    def lease_scope(self) -> LeaseScope | None:
        """Holds a turn's lease while `run`, `resume` and `run_until_blocked` step it (None: no lease)."""
        return self._ctx.lease_scope

    @lease_scope.setter
    def lease_scope(self, scope: LeaseScope | None) -> None:
        self._ctx.lease_scope = scope

    @property
    def dispatcher(self) -> TurnDispatcher | None:
        """Where turns that become runnable are handed (None: the runner works inline)."""
        execution = self._ctx.execution
        return execution.dispatcher if isinstance(execution, Dispatching) else None

    @dispatcher.setter
    def dispatcher(self, dispatcher: TurnDispatcher | None) -> None:
        self._ctx.execution = execution_mode(self._ctx, dispatcher)

    @property
    def chat_memory_provider(self) -> ChatMemoryProvider | None:
        """Maps a conversation id to its ChatMemory."""
        return self._ctx.projection.provider

    @property
    def conversation_guard(self) -> ConversationGuard | None:
        """The shared marker of active conversation turns, if any."""
        return self._ctx.gate.guard

    def add_event_listener(self, listener: AgentEventListener) -> None:
        """Call `listener` with every event of this runner, synchronously; its exceptions are logged and ignored."""
        self._ctx.listeners.append(listener)

    def run(
        self,
        agent: Agent | str,
        message: str | UserMessage,
        *,
        history: Sequence[ModelMessage] | None = None,
        conversation_id: str | None = None,
        tenant_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AgentTurn:
        """Create a turn and run it in this thread until it is blocked or ends.

        Args:
            agent: An `Agent`, or the id of one the agent loader knows.
            message: The new user message.
            history: Explicit earlier messages (copied into the turn; no conversation is bound).
            conversation_id: Run inside this conversation: history comes from its ChatMemory and
                only one turn of the conversation may be active at a time.
            tenant_id: The tenant that owns the turn (inherited by its child turns).
            metadata: JSON data kept with the turn.

        Raises:
            AgentConversationBusyException: The conversation already has an active turn.
        """
        turn = creation.create(
            self._ctx,
            agent,
            message,
            history=history,
            conversation_id=conversation_id,
            tenant_id=tenant_id,
            metadata=metadata,
        )
        return self.run_until_blocked(turn)

    def start(
        self,
        agent: Agent | str,
        message: str | UserMessage,
        *,
        history: Sequence[ModelMessage] | None = None,
        conversation_id: str | None = None,
        tenant_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        turn_id: str | None = None,
        not_before: datetime | None = None,
    ) -> AgentTurn:
        """Create and save a READY turn without running it (a worker picks it up).

        Args:
            agent: An `Agent`, or the id of one the agent loader knows.
            message: The new user message.
            history: Explicit earlier messages (copied into the turn; no conversation is bound).
            conversation_id: Start inside this conversation (see `run`).
            tenant_id: The tenant that owns the turn (inherited by its child turns).
            metadata: JSON data kept with the turn.
            turn_id: The new turn's id (default: a random one). A start with an id that is
                already stored raises `VersionConflictError`, which makes a start that may
                be repeated (a scheduled tick) happen once.
            not_before: No worker steps the turn before this time (a time zone is required; a past
                time means now). Until then it is queued, and it holds its conversation.

        Raises:
            AgentConversationBusyException: The conversation already has an active turn.
            VersionConflictError: A turn with `turn_id` is stored already.
            InputLimitError: `not_before` is naive or further ahead than the policy's `max_start_delay_s`.
        """
        turn = creation.create(
            self._ctx,
            agent,
            message,
            history=history,
            conversation_id=conversation_id,
            tenant_id=tenant_id,
            metadata=metadata,
            turn_id=turn_id,
            not_before=not_before,
        )
        self._ctx.execution.dispatch(turn)
        return turn

    def restore(self, turn_id: str) -> AgentTurn:
        """Load a turn from the store, check its agent is known, and redo any projection that failed.

        Raises:
            TurnNotFound: No such turn.
            AgentNotFound: The loader does not know the turn's agent and version.
            InputLimitError: `turn_id` is not an id (NUL characters and lone surrogates included).
        """
        turn = self.turn_store.load(check_id(turn_id, "turn_id", self.policy.limits))
        self.agent_loader.load(turn.agent_id, turn.agent_version)
        turn = self._ctx.projection.project(turn)
        if turn.status is AgentTurnStatus.WAITING_FOR_CHILD:
            turn = children.reconcile(self._ctx, turn)
        return turn

    def step(self, turn: AgentTurn) -> AgentStepResult:
        """Advance the turn by one step: one model call, one tool call, or one suspension.

        A turn that is not runnable (waiting, terminal, a retry that is not due, a delayed start that
        has not come) is returned unchanged.
        """
        return executing.step(self._ctx, turn)

    def advance(
        self,
        turn: AgentTurn,
        *,
        fence: int | None = None,
        max_steps: int | None = None,
        deadline: float | None = None,
        may_continue: Callable[[], bool] | None = None,
    ) -> AdvanceResult:
        """Step `turn` until it blocks or ends, or a budget or the caller's lease runs out.

        The stepping loop of `run_until_blocked` and `deliver`; it takes no lease. A step that raises is reported.

        Args:
            turn: The snapshot to continue from (load it after taking the lease).
            fence: The lease's fencing number, stamped on every save.
            max_steps: Most steps to make.
            deadline: `time.monotonic()` after which no further step starts (the first always may).
            may_continue: Asked before each step; False stops (a lost lease, a stopping worker).
        """
        return stepping.step_until_stopped(
            self._ctx, turn, fence=fence, max_steps=max_steps, deadline=deadline, may_continue=may_continue
        )

    def deliver(
        self, turn_id: str, holder: TurnHolder, *, version: int | None = None, seen: Sighting | None = None
    ) -> Delivery:
        """Deliver a turn to a worker (`AgentWorker`, the Celery task): lease, snapshot, checks, `advance`, release.

        `holder` is what differs between workers; `version`: the only version to step (None: any).

        Raises:
            StoreError: The lease backend or the store failed before a step; the lease is released.
        """
        return delivery.deliver(self._ctx, turn_id, holder, version=version, seen=seen)

    def run_until_blocked(self, turn: AgentTurn) -> AgentTurn:
        """Step the turn until it waits or ends, and return the last snapshot.

        A due RETRY_SCHEDULED turn is retried once; a retry scheduled during the run ends it (no thread is
        held while waiting), as does a READY turn whose delayed start has not come. With a `lease_scope`,
        the turn is stepped under its lease from the newest snapshot (returned as it is when another
        holder ran the turn until it blocked meanwhile).
        """
        return stepping.run_until_blocked(self._ctx, turn)

    def resume(self, turn_id: str, command: AgentResumeCommand) -> AgentTurn:
        """Validate and apply `command`, then continue the turn in this thread.

        Raises:
            InvalidResumeCommand: The command does not fit the turn's suspension; nothing changed.
        """
        turn = resuming.apply_resume(self._ctx, turn_id, command)
        if turn.is_runnable(self.clock()):
            return self.run_until_blocked(turn)
        return turn

    def submit_resume(self, turn_id: str, command: AgentResumeCommand) -> AgentTurn:
        """Validate and apply `command` and save the turn as RUNNING, without running it.

        Raises:
            InvalidResumeCommand: The command does not fit the turn's suspension; nothing changed.
        """
        return resuming.submit_resume(self._ctx, turn_id, command)

    def cancel(self, turn_id: str, reason: str | None = None, *, cancelled_by: str | None = None) -> AgentTurn:
        """Cancel a turn and its children.

        A READY (a delayed start too), waiting or RETRY_SCHEDULED turn ends at once (CANCELLED, history
        closed out, its pending approval and form cards settled as decided by `cancelled_by`, else by
        `"system"`). A RUNNING turn gets a durable cancel flag and the thread stepping it ends it at its
        next boundary. A turn that already ended is returned unchanged.

        Raises:
            InputLimitError: `turn_id` is not an id, or `reason` is over the policy's
                `max_message_bytes`; nothing changed.
            InvalidTextError: `reason` holds text no store can keep; nothing changed.
        """
        return endings.cancel(self._ctx, turn_id, reason, cancelled_by)

    def steer(self, turn_id: str, text: str, *, message_id: str | None = None) -> AgentTurn:
        """Add a user message to a working turn, before its next model call; return the turn that will read it.

        Stored at once by any process without the lease, applied in order, never between a tool call and
        its result. A turn that ends first hands it to its conversation's active or next turn (see
        `agent_runner._runtime.steering`). The same `message_id` again changes nothing.

        Raises:
            TurnNotFound, InputLimitError: No such turn; an id or the text over the policy's limits.
            SteeringRefusedError: The turn had ended, cancelled or outside a conversation, before the message came.
            DefinitionError: The turn store keeps no steering messages.
        """
        return steering.steer(self._ctx, turn_id, text, message_id)

    def suspend(self, turn: AgentTurn, suspension: AgentSuspension) -> AgentTurn:
        """Suspend a READY or RUNNING turn with a custom suspension (normally a plain-text question).

        Raises:
            InvalidTransitionError: The turn is not READY or RUNNING.
        """
        return resuming.suspend(self._ctx, turn, suspension)

    def apply_deadline(self, turn_id: str) -> AgentTurn:
        """Act on a waiting turn whose deadline reminder or deadline has come (the deadline sweep calls this).

        Once the deadline has passed, the suspension's `on_timeout` default goes through the normal resume
        path (`AgentResumeCommand.deadline_passed`, decided by `"system"`, then `submit_resume`); a decision
        that came first wins. Before it, once the reminder time has passed, DEADLINE_APPROACHING is saved
        with the turn and emitted, once.

        Returns:
            The newest snapshot.
        """
        return resuming.apply_deadline(self._ctx, turn_id)

    def apply_due_deadlines(self, limit: int = resuming.DEADLINE_BATCH) -> int:
        """Send due deadline reminders and apply passed deadlines' defaults; return how many turns were handled.

        The deadline sweep of every deployment. Each due turn goes through `apply_deadline`, a compare-and-swap
        decision, so two sweeps at once remind and apply a default once. `limit`: most turns handled; the rest
        wait for the next sweep, earliest first.

        Raises:
            DefinitionError: The turn store cannot list due deadlines (it is not a `DeadlineSource`).
            StoreError: The store could not list them.
        """
        return resuming.apply_due_deadlines(self._ctx, limit)

    def agent_for(self, turn: AgentTurn) -> Agent:
        """The agent definition of a turn, from the loader."""
        return self._ctx.agent_for(turn)

    def reconcile_children(self, turn_id: str) -> AgentTurn:
        """Recover a parent stuck in WAITING_FOR_CHILD whose children all ended (used by sweeps)."""
        parent = children.reconcile(self._ctx, self.turn_store.load(turn_id))
        if parent.is_runnable(self.clock()):
            self._ctx.execution.dispatch(parent)
        return parent
