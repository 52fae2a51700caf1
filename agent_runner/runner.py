"""`AgentRunner`: the shell around the pure state machine.

The runner performs what `machine.plan_step` decides (a model call, a tool call, a
suspension, child turns), folds the outcome in with the `machine.apply_*` functions,
saves every stable boundary with a compare-and-swap, projects new messages into the
conversation's ChatMemory and emits events. It keeps no turn state in its fields, so one
runner serves a whole application and any process can continue any turn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from agent_runner import event_payloads as payloads
from agent_runner import machine, telemetry  # telemetry hook: trace context of new turns
from agent_runner._base import trusted
from agent_runner._cancelling import request_cancel, stored_cancel_reason
from agent_runner._cas import AGAIN, retry_on_conflict
from agent_runner._children import ChildTurns
from agent_runner._conversations import ConversationGate
from agent_runner._outcomes import BodyWatch, find_outcome, outcome_unknown_suspension
from agent_runner._projection import Projection
from agent_runner._stepping import AdvanceResult, StopReason, advance
from agent_runner.agent import Agent, InMemoryAgentLoader
from agent_runner.errors import (
    AgentFormRequiredException,
    AgentRunnerError,
    DefinitionError,
    FormProtocolError,
    InvalidResumeCommand,
    InvalidTransitionError,
    RecoverableError,
    ToolError,
    TurnError,
    TurnNotFound,
    VersionConflictError,
)
from agent_runner.events import AgentEvent, AgentEventListener, AgentEventType
from agent_runner.ids import new_id, utcnow
from agent_runner.in_memory import InMemoryAgentTurnStore
from agent_runner.leasing import HeldLease
from agent_runner.limits import (
    bounded_text,
    check_id,
    check_resume_input,
    check_text,
    check_turn_input,
    storable_text,
)
from agent_runner.messages import AiMessage, ModelMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from agent_runner.middleware import Middleware, chain
from agent_runner.models import ChatRequest, ChatResponse
from agent_runner.persistence import (
    AgentLoader,
    AgentTurnStore,
    ChatMemoryProvider,
    ConversationGuard,
    DeadlineSource,
    TurnDispatcher,
)
from agent_runner.policy import AgentExecutionPolicy, RetryPolicy
from agent_runner.snapshot import AgentTurn, AgentTurnStatus
from agent_runner.suspensions import AgentResumeCommand, AgentSuspension, ResumeType
from agent_runner.tools import Tool, encode_tool_result, tool_scope

logger = logging.getLogger("agent_runner")

DEADLINE_BATCH = 500
"""Most turns one deadline sweep handles (`AgentRunner.apply_due_deadlines`)."""

S = AgentTurnStatus

LeaseScope = Callable[[str], AbstractContextManager[HeldLease | None]]
"""Holds a turn's lease for the duration of a `with` block.

It yields the held lease, or None when another holder advanced the turn until it stopped
being runnable (so there is nothing left to step)."""

PendingEvent = payloads.EventBody | None
"""An event a save causes: its type and fields, from `agent_runner.event_payloads` (None: no event)."""

# The fields the runner sets when it builds these models from validated data (see `trusted`).
_EVENT_GIVEN = frozenset(AgentEvent.model_fields) - {"cursor"}
_REQUEST_GIVEN = frozenset(ChatRequest.model_fields)
_RESPONSE_GIVEN = frozenset(ChatResponse.model_fields)

TERMINAL_EVENTS: dict[AgentTurnStatus, AgentEventType] = {
    S.COMPLETED: AgentEventType.TURN_COMPLETED,
    S.FAILED: AgentEventType.TURN_FAILED,
    S.CANCELLED: AgentEventType.TURN_CANCELLED,
    S.MAX_ITERATIONS_REACHED: AgentEventType.MAX_ITERATIONS_REACHED,
    S.MAX_STEPS_REACHED: AgentEventType.MAX_STEPS_REACHED,
    S.BUDGET_EXCEEDED: AgentEventType.BUDGET_EXCEEDED,
}


@dataclass(frozen=True)
class AgentStepResult:
    """What one step produced directly. Read `turn.status` to know whether the turn goes on.

    Attributes:
        response: The model response of this step (None when the model was not called).
        tool_messages: ToolMessages written by this step.
        error: The exception behind a retry or failure in this step, else None.
        turn: The snapshot after the step.
    """

    turn: AgentTurn
    response: ChatResponse | None = None
    tool_messages: list[ToolMessage] = field(default_factory=list)
    error: BaseException | None = None


class _Inline:
    """Turns run in the calling thread: children are driven recursively, nothing is handed off."""

    def __init__(self, runner: AgentRunner) -> None:
        self.runner = runner

    def dispatch(self, turn: AgentTurn) -> None:
        """Nothing to hand over: whoever runs the turn continues it."""

    def children_waiting(self, parent: AgentTurn) -> AgentTurn:
        """Run the children here; return the parent's latest snapshot."""
        return self.runner._children.drive(parent)

    def parent_resumed(self, parent: AgentTurn) -> None:
        """Continue the parent here, unless this thread is already driving it (it continues then)."""
        if not self.runner._is_driving(parent.id):
            self.runner.run_until_blocked(parent)


class _Dispatching:
    """Turns that become runnable are handed to a dispatcher (a worker pool, a Celery queue)."""

    def __init__(self, dispatcher: TurnDispatcher) -> None:
        self.dispatcher = dispatcher

    def dispatch(self, turn: AgentTurn) -> None:
        """Hand the turn over."""
        self.dispatcher.dispatch(turn)

    def children_waiting(self, parent: AgentTurn) -> AgentTurn:
        """The children were dispatched when they were created: the parent just waits."""
        return parent

    def parent_resumed(self, parent: AgentTurn) -> None:
        """Hand the parent over."""
        self.dispatcher.dispatch(parent)


class AgentRunner:
    """Runs agent turns as durable state machines.

    Args:
        turn_store: Where snapshots live (default: a new `InMemoryAgentTurnStore`).
        agent_loader: Finds agents by id and version for `restore` and for turns started by id
            (default: an `InMemoryAgentLoader`; agents passed to `run`/`start` are registered in it).
        chat_memory_provider: Maps a conversation id to its `ChatMemory`; needed for conversation turns.
        policy: Limits, retry schedule and close-out templates.
        middleware: Wrappers of model calls, tool calls and steps; the first is the outermost.
        dispatcher: When set, turns that become runnable outside the calling thread's flow
            (started, resumed with `submit_resume`, child turns, a parent whose last child
            ended) are handed to it instead of being run in this thread. Without one, the
            runner works inline: child turns run recursively in the thread that runs the parent.
        conversation_guard: A shared fast marker of active conversation turns (for example
            Redis); the turn store remains the truth.
        clock: Returns the current UTC time (tests may pass a fake clock).
        lease_scope: When set, `run`, `resume` and `run_until_blocked` step a turn only while
            holding its lease from this scope, and stamp the lease's fence on every save. An
            `AgentWorker` sets it on the runner it serves, so a turn run in the caller's
            thread is never stepped at the same time by the worker's polling threads.
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
    ) -> None:
        self.turn_store: AgentTurnStore = turn_store if turn_store is not None else InMemoryAgentTurnStore()
        self.agent_loader: AgentLoader = agent_loader if agent_loader is not None else InMemoryAgentLoader()
        self.policy = policy if policy is not None else AgentExecutionPolicy()
        self.middleware = list(middleware)
        for item in self.middleware:
            if not isinstance(item, Middleware):
                raise DefinitionError(f"{item!r} is not a Middleware; subclass agent_runner.Middleware")
        self.clock = clock
        self.lease_scope = lease_scope
        self._listeners: list[AgentEventListener] = []
        self._local = threading.local()
        self._projection = Projection(chat_memory_provider, self._projection_failed)
        self._gate = ConversationGate(self.turn_store, conversation_guard)
        self._children = ChildTurns(self)
        self._execution: _Inline | _Dispatching = _Inline(self)
        self.dispatcher = dispatcher

    @property
    def dispatcher(self) -> TurnDispatcher | None:
        """Where turns that become runnable are handed (None: the runner works inline)."""
        return self._execution.dispatcher if isinstance(self._execution, _Dispatching) else None

    @dispatcher.setter
    def dispatcher(self, dispatcher: TurnDispatcher | None) -> None:
        self._execution = _Inline(self) if dispatcher is None else _Dispatching(dispatcher)

    @property
    def chat_memory_provider(self) -> ChatMemoryProvider | None:
        """Maps a conversation id to its ChatMemory."""
        return self._projection.provider

    @property
    def conversation_guard(self) -> ConversationGuard | None:
        """The shared marker of active conversation turns, if any."""
        return self._gate.guard

    # --- Public API --------------------------------------------------------------------------

    def add_event_listener(self, listener: AgentEventListener) -> None:
        """Call `listener` with every event of this runner, synchronously; its exceptions are logged and ignored."""
        self._listeners.append(listener)

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
        turn = self._create(
            agent, message, history=history, conversation_id=conversation_id, tenant_id=tenant_id, metadata=metadata
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

        Raises:
            AgentConversationBusyException: The conversation already has an active turn.
            VersionConflictError: A turn with `turn_id` is stored already.
        """
        turn = self._create(
            agent,
            message,
            history=history,
            conversation_id=conversation_id,
            tenant_id=tenant_id,
            metadata=metadata,
            turn_id=turn_id,
        )
        self._execution.dispatch(turn)
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
        turn = self._projection.project(turn)
        if turn.status is S.WAITING_FOR_CHILD:
            turn = self._children.reconcile(turn)
        return turn

    def step(self, turn: AgentTurn) -> AgentStepResult:
        """Advance the turn by one step: one model call, one tool call, or one suspension.

        A turn that is not runnable (waiting, terminal, or a retry that is not due) is
        returned unchanged.
        """
        if not self.middleware:
            return self._step(turn)
        produced: list[AgentStepResult] = []

        def innermost(_: AgentTurn) -> AgentStepResult:
            # Middleware observes steps but cannot change the state flow: the step runs on the
            # caller's snapshot, and its own result is returned whatever the middleware returns.
            result = self._step(turn)
            produced.append(result)
            return result

        chain(self.middleware, "wrap_step", innermost)(turn)
        return produced[0] if produced else self._step(turn)

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

        The one stepping loop behind `run_until_blocked`, `AgentWorker` and the Celery task;
        it does not take a lease itself. A step that raises stops the loop and is reported
        in the result rather than raised.

        Args:
            turn: The snapshot to continue from (load it after taking the lease).
            fence: The lease's fencing number, stamped on every save.
            max_steps: Most steps to make.
            deadline: `time.monotonic()` after which no further step starts (the first always may).
            may_continue: Asked before each step; False stops (a lost lease, a stopping worker).
        """
        if may_continue is None:
            return advance(self, turn, fence=fence, max_steps=max_steps, deadline=deadline)
        return advance(self, turn, fence=fence, max_steps=max_steps, deadline=deadline, may_continue=may_continue)

    def run_until_blocked(self, turn: AgentTurn) -> AgentTurn:
        """Step the turn until it waits or ends, and return the last snapshot.

        A RETRY_SCHEDULED turn that is due is retried once; a retry scheduled during the
        run ends the run (the thread is not held while waiting).

        With a `lease_scope`, the turn is stepped under its lease, taken from the newest
        stored snapshot; when another holder ran the turn until it blocked meanwhile, that
        snapshot is returned as it is.
        """
        scope = self.lease_scope
        if scope is None or not turn.is_runnable(self.clock()):
            return _raise_failure(advance(self, turn))
        # Workers poll the store for READY and RUNNING turns: stepping here without the
        # lease could call the model or a tool twice, once here and once on a worker.
        with scope(turn.id) as held:
            if held is None:
                return self.turn_store.load(turn.id)
            # The snapshot passed in may predate a holder that worked on the turn while this
            # thread waited for the lease; continue from the stored one, under our fence.
            current = self.turn_store.load(turn.id)
            return _raise_failure(advance(self, current, fence=held.fence))

    def resume(self, turn_id: str, command: AgentResumeCommand) -> AgentTurn:
        """Validate and apply `command`, then continue the turn in this thread.

        Raises:
            InvalidResumeCommand: The command does not fit the turn's suspension; nothing changed.
        """
        turn = self._apply_resume(turn_id, command)
        if turn.is_runnable(self.clock()):
            return self.run_until_blocked(turn)
        return turn

    def submit_resume(self, turn_id: str, command: AgentResumeCommand) -> AgentTurn:
        """Validate and apply `command` and save the turn as RUNNING, without running it.

        Raises:
            InvalidResumeCommand: The command does not fit the turn's suspension; nothing changed.
        """
        turn = self._apply_resume(turn_id, command)
        if turn.is_runnable(self.clock()):
            self._execution.dispatch(turn)
        return turn

    def cancel(self, turn_id: str, reason: str | None = None, *, cancelled_by: str | None = None) -> AgentTurn:
        """Cancel a turn and its children.

        A READY, waiting or RETRY_SCHEDULED turn ends at once (CANCELLED, history closed out,
        its pending approval and form cards settled as decided by `cancelled_by`, else by
        `"system"`). A RUNNING turn gets a durable cancel flag and the thread stepping it
        ends it at its next boundary. A turn that already ended is returned unchanged.

        Raises:
            InputLimitError: `turn_id` is not an id, or `reason` is over the policy's
                `max_message_bytes`; nothing changed.
            InvalidTextError: `reason` holds text no store can keep; nothing changed.
        """
        check_id(turn_id, "turn_id", self.policy.limits)
        if reason is not None:
            check_text(reason, "reason", self.policy.limits.max_message_bytes)
        given = reason or None

        def attempt() -> AgentTurn | object:
            turn = self.turn_store.load(turn_id)
            if turn.is_terminal:
                return turn
            if turn.status is S.RUNNING:
                flagged = request_cancel(self.turn_store, turn_id, given)
                # It blocked or ended meanwhile: cancel that state instead.
                return flagged if flagged.status is S.RUNNING else AGAIN
            # A turn flagged while it ran and then suspended ends with the flag's reason.
            reason = given or turn.cancel_reason or self.policy.cancellation_reason
            return self._finish(turn, S.CANCELLED, reason, decided_by=cancelled_by)

        return retry_on_conflict(turn_id, attempt)  # type: ignore[return-value]

    def suspend(self, turn: AgentTurn, suspension: AgentSuspension) -> AgentTurn:
        """Suspend a READY or RUNNING turn with a custom suspension (normally a plain-text question).

        Raises:
            InvalidTransitionError: The turn is not READY or RUNNING.
        """
        if turn.status not in (S.READY, S.RUNNING):
            raise InvalidTransitionError(turn.status, machine.SUSPENSION_STATUS[suspension.type], {S.READY, S.RUNNING})
        if turn.pending_tool_calls:
            # A user message cannot sit between a tool call and its result: the model API
            # would reject the history. Suspend before the model step or after the tools ran.
            raise TurnError(
                f"turn {turn.id!r} has {len(turn.pending_tool_calls)} unanswered tool call(s); "
                "it can be suspended only when no tool call is pending"
            )
        suspended = machine.apply_suspension(turn, machine.Suspend(suspension, None), self.clock(), count_step=False)
        return self._save(suspended, turn.version, self._suspended_event(suspended))

    def apply_deadline(self, turn_id: str) -> AgentTurn:
        """Act on a waiting turn whose deadline reminder or deadline has come (the deadline sweep calls this).

        Once the deadline has passed, the suspension's `on_timeout` default goes through the
        normal resume path (`AgentResumeCommand.deadline_passed`, decided by `"system"` with
        the reason "deadline passed", then `submit_resume`), so its events and page actions
        are those of any decision and a worker continues the turn. A decision that came
        first wins; the default is then not applied. Before the deadline, once the reminder
        time has passed, DEADLINE_APPROACHING is saved with the turn and emitted, once.
        Otherwise nothing changes.

        Returns:
            The newest snapshot.
        """
        due: list[AgentSuspension] = []

        def attempt() -> AgentTurn:
            turn = self.turn_store.load(turn_id)
            suspension = turn.suspension
            now = self.clock()
            if suspension is None or turn.wake_at is None or suspension.deadline is None or turn.wake_at > now:
                return turn
            if suspension.deadline <= now:
                due.append(suspension)
                return turn
            reminded = machine.apply_reminder(turn, now)
            return self._save(reminded, turn.version, payloads.deadline_approaching(suspension))

        turn = retry_on_conflict(turn_id, attempt)
        if not due:
            return turn
        command = AgentResumeCommand.deadline_passed(due[0].correlation_id).with_metadata(
            "decided_by", machine.SYSTEM_DECIDER
        )
        try:
            return self.submit_resume(turn_id, command)
        except InvalidResumeCommand:
            return self.turn_store.load(turn_id)  # decided (or cancelled) meanwhile: that decision stands

    def apply_due_deadlines(self, limit: int = DEADLINE_BATCH) -> int:
        """Send due deadline reminders and apply passed deadlines' defaults; return how many turns were handled.

        The deadline sweep of every deployment: Celery beat calls it, and so does the
        embedded `AgentWorker` (in the HTTP server, `agent-runner worker` and your own
        processes). Each due turn goes through `apply_deadline`, a compare-and-swap decision,
        so two sweeps at once remind once and apply a default once, and a person who decided
        first wins. A turn resumed by its default is handed on like any resume: to the
        dispatcher (the Celery workers, an `AgentWorker`), or left RUNNING for a worker.

        Args:
            limit: Most turns handled; the rest wait for the next sweep, earliest first.

        Raises:
            DefinitionError: The turn store cannot list due deadlines (it is not a `DeadlineSource`).
            StoreError: The store could not list them.
        """
        source = self.turn_store
        if not isinstance(source, DeadlineSource):
            raise DefinitionError(
                f"the turn store {type(source).__name__} cannot list due deadlines (it has no list_due_timers)"
            )
        handled = 0
        for ref in source.list_due_timers(self.clock(), limit):
            try:
                self.apply_deadline(ref.turn_id)
                handled += 1
            except AgentRunnerError as exc:
                logger.warning("could not apply the deadline of turn %s: %s", ref.turn_id, exc)
        return handled

    def agent_for(self, turn: AgentTurn) -> Agent:
        """The agent definition of a turn, from the loader."""
        return self.agent_loader.load(turn.agent_id, turn.agent_version)

    def reconcile_children(self, turn_id: str) -> AgentTurn:
        """Recover a parent stuck in WAITING_FOR_CHILD whose children all ended (used by sweeps)."""
        parent = self._children.reconcile(self.turn_store.load(turn_id))
        if parent.is_runnable(self.clock()):
            self._execution.dispatch(parent)
        return parent

    # --- Creation ----------------------------------------------------------------------------

    def _resolve_agent(self, agent: Agent | str) -> Agent:
        if isinstance(agent, Agent):
            register = getattr(self.agent_loader, "register", None)
            if callable(register):
                register(agent)
            return agent
        return self.agent_loader.load(agent)

    def _create(
        self,
        agent_ref: Agent | str,
        message: str | UserMessage,
        *,
        history: Sequence[ModelMessage] | None,
        conversation_id: str | None,
        tenant_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        turn_id: str | None = None,
    ) -> AgentTurn:
        check_turn_input(self.policy.limits, message, history, conversation_id, tenant_id, metadata)
        if turn_id is not None:
            check_id(turn_id, "turn_id", self.policy.limits)
        agent = self._resolve_agent(agent_ref)
        user = UserMessage(content=message) if isinstance(message, str) else message
        if not isinstance(user, UserMessage):
            raise DefinitionError(f"a turn starts from a str or UserMessage, got {type(message).__name__}")
        if history is not None and conversation_id is not None:
            raise DefinitionError("pass either history= (explicit history) or conversation_id= (ChatMemory), not both")
        window: list[ModelMessage] = []
        if history is not None:
            window = [m for m in history if m.model_visible]
        elif conversation_id is not None:
            self._finish_projection_of_last_turn(conversation_id)
            window = self._projection.memory(conversation_id).get_model_messages(agent.max_attached_messages)
        turn_id = turn_id or new_id()
        now = self.clock()
        turn = AgentTurn(
            id=turn_id,
            agent_id=agent.id,
            agent_version=agent.version,
            conversation_id=conversation_id,
            root_turn_id=turn_id,
            messages=[*window, user],
            projected_count=len(window),
            root_conversation_id=conversation_id,
            tenant_id=tenant_id,
            metadata=dict(metadata or {}),
            created_at=now,
            updated_at=now,
        )
        turn = telemetry.stamp_new_turn(self, turn)  # trace context of the new turn
        started = self._event(payloads.turn_started(turn, user.id), turn, 0, 0)
        saved = self._gate.create(turn, [started], self._save_turn)
        self._deliver(started)
        return self._projection.project(saved)

    def _finish_projection_of_last_turn(self, conversation_id: str) -> None:
        """Redo the projection of the conversation's last turn if it ended before ChatMemory had it all.

        A failed projection is retried after the next save of the turn, but an ended turn has
        no next save: without this, its last messages (the final answer) would be missing
        from the history every later turn of the conversation reads.
        """
        if self.chat_memory_provider is None:
            return
        try:
            last = self.turn_store.list_turns(conversation_id=conversation_id, limit=1)
        except AgentRunnerError as exc:
            logger.warning("could not check the last turn of conversation %s: %s", conversation_id, exc)
            return
        for turn in last:
            unsynced = any(not action.synced for action in turn.page_actions)
            if turn.is_terminal and (turn.projected_count < len(turn.messages) or unsynced):
                self._projection.project(turn)

    # --- Stepping ----------------------------------------------------------------------------

    def _step(self, turn: AgentTurn) -> AgentStepResult:
        now = self.clock()
        if not turn.is_runnable(now):
            return AgentStepResult(turn=turn)
        expected = turn.version
        self._carried(turn.id).clear()  # nothing carries over from a step that raised
        if turn.status is S.RETRY_SCHEDULED:
            self._carry(payloads.turn_resumed(command=None, reason="retry due", attempt=turn.attempt), turn)
        agent = self.agent_for(turn)
        running = machine.start_running(turn, now)
        plan = machine.plan_step(running, agent, self.policy)
        try:
            if turn.status is S.READY and isinstance(plan, machine.CallModel):
                # Taken off the queue: say so durably before the model call, which may take a
                # while, so that clients can tell a queued turn from a running one.
                running = self._save(running, expected, payloads.turn_running())
                expected = running.version
            match plan:
                case machine.Terminate(status=status, reason=reason):
                    if status is S.CANCELLED:
                        reason = stored_cancel_reason(self.turn_store, running) or reason
                    return AgentStepResult(turn=self._finish(running, status, reason, expected_version=expected))
                case machine.CallModel():
                    return self._call_model(running, agent, expected)
                case machine.ExecuteTool(call=call, tool=tool):
                    return self._execute_tool(running, call, tool, expected, self.policy.retry_for(agent))
                case machine.ReconcileTool(call=call, tool=tool):
                    return self._reconcile_tool(running, call, tool, expected, self.policy.retry_for(agent), None)
                case machine.WriteToolResult(call=call, content=content, is_error=is_error):
                    updated, message = machine.apply_tool_result(running, call, content, is_error, now)
                    saved = self._save(updated, expected, payloads.tool_completed(call, is_error))
                    return AgentStepResult(turn=saved, tool_messages=[message])
                case machine.Suspend():
                    suspended = machine.apply_suspension(running, plan, now, reminder=self.policy.deadline_reminder)
                    return AgentStepResult(turn=self._save(suspended, expected, self._suspended_event(suspended)))
                case machine.SpawnChildren(calls=calls):
                    return AgentStepResult(turn=self._children.spawn(running, calls, expected))
        except VersionConflictError as conflict:
            # Someone else advanced the turn (a resume, a cancel, another worker): never
            # overwrite it; hand back the newer snapshot.
            logger.warning(
                "turn %s changed while a step ran (the step expected version %s, the store has %s); "
                "the step's save is dropped and the newer snapshot wins",
                turn.id,
                conflict.expected_version,
                conflict.actual_version,
            )
            return AgentStepResult(turn=self.turn_store.load(turn.id), error=conflict)
        raise AssertionError(f"unhandled plan {plan!r}")  # pragma: no cover

    def _call_model(self, turn: AgentTurn, agent: Agent, expected: int) -> AgentStepResult:
        if agent.chat_model is None:
            raise DefinitionError(f"agent {agent.id!r} has no chat_model")
        chat_model = agent.chat_model
        request = trusted(
            ChatRequest,
            _REQUEST_GIVEN,
            {
                "messages": self._request_messages(turn, agent),
                "tools": agent.tool_specs(),
                "on_delta": _DeltaSink(self, turn),
            },
        )
        try:
            raw: object = chain(self.middleware, "wrap_model", chat_model.generate)(request)
            # Lenient with hand-written models and middleware that return a bare AiMessage.
            response = ChatResponse(message=raw) if isinstance(raw, AiMessage) else raw
            if not isinstance(response, ChatResponse):
                raise DefinitionError(f"chat model returned {type(response).__name__}, expected ChatResponse")
        except _CancelledMidCall:
            # Cancelled while the answer streamed in: stop paying for it and end the turn now.
            reason = stored_cancel_reason(self.turn_store, turn) or self.policy.cancellation_reason
            return AgentStepResult(turn=self._finish(turn, S.CANCELLED, reason, expected_version=expected))
        except Exception as exc:
            return self._failed_call(turn, exc, expected, self.policy.retry_for(agent))
        updated, message = machine.apply_model_response(turn, response, self.clock())
        response = trusted(ChatResponse, _RESPONSE_GIVEN, {"message": message, "usage": response.usage})
        usage = response.usage
        event = payloads.model_response(
            message.id, message.content, [c.name for c in message.tool_calls], usage.input_tokens, usage.output_tokens
        )
        saved = self._save(updated, expected, event, _terminal_event(updated))
        if saved.is_terminal:
            self._after_terminal(saved)
        return AgentStepResult(turn=saved, response=response)

    def _request_messages(self, turn: AgentTurn, agent: Agent) -> list[ModelMessage]:
        messages: list[ModelMessage] = []
        if agent.instructions:
            messages.append(SystemMessage(id=f"{agent.id}-instructions", content=agent.instructions))
        messages.extend(turn.messages)
        return messages

    def _execute_tool(
        self, turn: AgentTurn, call: ToolCall, tool: Tool, expected: int, retry: RetryPolicy
    ) -> AgentStepResult:
        self._carry(payloads.tool_started(call), turn)
        started = turn
        if not tool.idempotent:
            # Saved before the body runs: after a crash, the call is known to have started and
            # is reconciled instead of being run again. The saves after the body forget the mark.
            started = self._save(machine.mark_started(turn, call.id, self.clock()), expected)
            expected = started.version
            turn = machine.unmark_started(started, call.id)
        submitted = turn.form_data.get(call.id, {})
        body = BodyWatch()  # middleware may fail before the body runs, or recast what it raised

        def progress(data: Any) -> None:
            if not self._listeners:
                return
            try:
                body = payloads.tool_progress(call, data)
            except ValidationError:
                # A report that is not JSON must not fail the tool that made it.
                logger.warning("tool %s reported progress that is not JSON; it is dropped: %r", call.name, data)
                return
            self._emit(body, turn)

        def invoke(tool_call: ToolCall) -> Any:
            with tool_scope(turn, tool_call, submitted, progress):
                return body.invoke(tool, tool_call.arguments)

        is_error = False
        try:
            content = self._tool_text(encode_tool_result(chain(self.middleware, "wrap_tool", invoke)(call)))
        except ToolError as exc:
            content, is_error = self._tool_text(str(exc)), True
        except AgentFormRequiredException as exc:
            if call.id in turn.form_data:
                error = FormProtocolError(turn.id, call.id, exc.form.key)
                failed = self._finish(turn, S.FAILED, str(error), expected_version=expected)
                return AgentStepResult(turn=failed, error=error)
            plan = machine.form_suspension(turn, call, exc.form, machine.FORM_SOURCE_TOOL, exc.message)
            suspended = machine.apply_suspension(turn, plan, self.clock(), reminder=self.policy.deadline_reminder)
            return AgentStepResult(turn=self._save(suspended, expected, self._suspended_event(suspended)))
        except Exception as exc:
            if body.leaves_outcome_unknown(tool):
                return self._reconcile_tool(started, call, tool, expected, retry, exc)
            return self._failed_call(turn, exc, expected, retry, tool.retry_on)
        updated, message = machine.apply_tool_result(turn, call, content, is_error, self.clock())
        saved = self._save(updated, expected, payloads.tool_completed(call, is_error))
        return AgentStepResult(turn=saved, tool_messages=[message])

    def _reconcile_tool(
        self, turn: AgentTurn, call: ToolCall, tool: Tool, expected: int, retry: RetryPolicy, raised: Exception | None
    ) -> AgentStepResult:
        """Settle a started non-idempotent call, never re-running it blindly (`raised`: what its body raised now)."""
        outcome = find_outcome(tool, turn, call)
        if outcome.state == "done":
            content = self._tool_text(encode_tool_result(outcome.result))
            updated, message = machine.apply_tool_result(turn, call, content, False, self.clock())
            saved = self._save(updated, expected, payloads.tool_completed(call, False, reconciled=True))
            return AgentStepResult(turn=saved, tool_messages=[message])
        if outcome.state == "not_done" and raised is not None:
            # Nothing took effect: the error counts as for any tool (retried on the schedule, or failed).
            return self._failed_call(machine.unmark_started(turn, call.id), raised, expected, retry, tool.retry_on)
        if outcome.state == "not_done":
            return self._execute_tool(machine.unmark_started(turn, call.id), call, tool, expected, retry)
        plan = outcome_unknown_suspension(turn, call, tool, outcome.note, raised)
        suspended = machine.apply_suspension(turn, plan, self.clock())
        return AgentStepResult(turn=self._save(suspended, expected, self._suspended_event(suspended)))

    def _tool_text(self, content: str) -> str:
        """A tool's answer in a form every store can save: unstorable characters replaced, cut at the message limit.

        A tool's return value, like model output, is kept rather than refused: the call ran,
        and failing its save would run it again.
        """
        return bounded_text(storable_text(content), self.policy.limits.max_message_bytes)

    def _failed_call(
        self,
        turn: AgentTurn,
        exc: Exception,
        expected: int,
        retry: RetryPolicy,
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> AgentStepResult:
        """A model or tool call raised: retry later if transient and attempts remain, else fail."""
        if isinstance(exc, VersionConflictError):
            raise exc
        description = f"{type(exc).__name__}: {exc}"
        if retry.is_transient(exc, retry_on):
            retry_after = exc.retry_after if isinstance(exc, RecoverableError) else None
            delay = retry.backoff(turn.attempt + 1, retry_after)
            scheduled = machine.schedule_retry(turn, description, delay, retry, self.clock())
            if scheduled is not None:
                saved = self._save(scheduled, expected, payloads.retry_scheduled(scheduled, description))
                self._execution.dispatch(saved)
                return AgentStepResult(turn=saved, error=exc)
            description = f"gave up after {turn.attempt + 1} attempts: {description}"
        failed = self._finish(turn, S.FAILED, description, expected_version=expected, steps=turn.steps + 1)
        return AgentStepResult(turn=failed, error=exc)

    # --- Ending ------------------------------------------------------------------------------

    def _finish(
        self,
        turn: AgentTurn,
        status: AgentTurnStatus,
        reason: str,
        *,
        expected_version: int | None = None,
        steps: int | None = None,
        decided_by: str | None = None,
    ) -> AgentTurn:
        """Close out and save a terminal snapshot, then cascade to children, guard and parent."""
        expected = turn.version if expected_version is None else expected_version
        ended = machine.close_out(turn, status, reason, self.policy, self.clock(), decided_by)
        if steps is not None:
            ended = ended.model_copy(update={"steps": steps})
        saved = self._save(ended, expected, _terminal_event(ended))
        self._after_terminal(saved)
        return saved

    def _after_terminal(self, turn: AgentTurn) -> None:
        self._children.cancel_unfinished(turn)
        self._gate.release(turn)
        if turn.parent_turn_id is not None and not self._is_driving(turn.id):
            # A child that ended outside a stepping loop (cancelled, resumed elsewhere) tells its parent now.
            self._children.child_ended(turn)

    def _step_failed(self, turn: AgentTurn, exc: Exception) -> AgentTurn:
        """Count a step that raised; end the turn FAILED when that makes too many in a row.

        Transient store and lease errors are not the turn's fault and are not counted; nor
        can anything be counted while the store is unreachable. Returns the newest snapshot.
        """
        if isinstance(exc, AgentRunnerError) and exc.retryable:
            return turn
        description = f"{type(exc).__name__}: {exc}"
        try:
            # The step may have saved before it raised (a READY turn is saved RUNNING first):
            # count on the stored snapshot, under the caller's fence.
            current = self.turn_store.load(turn.id)
            if current.is_terminal:
                return current
            current = current.model_copy(update={"lease_fence": turn.lease_fence})
            failures = current.step_failures + 1
            if failures >= self.policy.max_step_failures:
                logger.error("turn %s failed %d steps in a row; ending it: %s", turn.id, failures, description)
                reason = f"a step failed {failures} times in a row: {description}"
                return self._finish(current, S.FAILED, reason[:2000])
            return self.turn_store.save(current.model_copy(update={"step_failures": failures}), current.version)
        except AgentRunnerError as error:
            logger.warning("could not count the failed step of turn %s: %s", turn.id, error)
            return turn

    def _cancel_quietly(self, turn_id: str, reason: str | None = None) -> AgentTurn | None:
        """Cancel a turn; a failure is logged (the turn then ends by a later cancel or a sweep)."""
        try:
            return self.cancel(turn_id, reason)
        except AgentRunnerError as exc:
            logger.warning("could not cancel turn %s: %s", turn_id, exc)
            return None

    # --- Resume ------------------------------------------------------------------------------

    def _apply_resume(self, turn_id: str, command: AgentResumeCommand) -> AgentTurn:
        check_resume_input(self.policy.limits, turn_id, command)
        if command.type is ResumeType.CHILD_COMPLETED:
            turn = self.turn_store.load(turn_id)
            try:
                child = self.turn_store.load(command.child_turn_id) if command.child_turn_id else None
            except TurnNotFound:
                child = None  # an unknown child id makes the command invalid; the turn itself exists
            if child is None or child.parent_turn_id != turn_id:
                raise InvalidResumeCommand(
                    f"turn {command.child_turn_id!r} is not a child of turn {turn_id!r}", turn_id=turn_id
                )
            machine.apply_resume(turn, command, self.clock(), child=child)  # validate before writing
            recorded = self._children.record(turn_id, child)
            return recorded if recorded is not None else self.turn_store.load(turn_id)
        event = payloads.turn_resumed(
            command=command.type, tool_call_id=command.tool_call_id, reason=command.reason, metadata=command.metadata
        )

        def attempt() -> AgentTurn:
            # Re-validated against the newest snapshot each time: a concurrent decision wins once.
            turn = self.turn_store.load(turn_id)
            schema = self._edited_tool_schema(turn, command)
            return self._save(
                machine.apply_resume(turn, command, self.clock(), edit_schema=schema), turn.version, event
            )

        return retry_on_conflict(turn_id, attempt)

    def _edited_tool_schema(self, turn: AgentTurn, command: AgentResumeCommand) -> dict[str, Any] | None:
        """The argument schema of the tool an EDIT_TOOL command edits (None for other commands or no such tool)."""
        if command.type is not ResumeType.EDIT_TOOL:
            return None
        call = next((c for c in turn.pending_tool_calls if c.id == command.tool_call_id), None)
        tool = None if call is None else self.agent_for(turn).tool(call.name)
        return None if tool is None else dict(tool.parameters)

    # --- Persistence and events --------------------------------------------------------------

    def _save(self, turn: AgentTurn, expected_version: int, *events: PendingEvent) -> AgentTurn:
        """Compare-and-swap save with the events it causes, then project into ChatMemory and deliver them.

        The events are written in the same transaction as the snapshot (a saved state never
        lacks its events, an event never describes an unsaved state), with ids made of the
        turn id, the saved version and their position, so a step re-run after a crash cannot
        write them twice. Events carried from earlier in the step (TOOL_STARTED, a retry
        coming due) are saved with them; listeners saw those already.
        """
        version = expected_version + 1
        carried = self._carried(turn.id)
        built = list(carried)
        carried.clear()
        delivered = len(built)
        for pending in events:
            if pending is not None:
                built.append(self._event(pending, turn, version, len(built)))
        saved = self._save_turn(turn, expected_version, built)
        if saved.conversation_id is not None:
            saved = self._projection.project(saved)
        for event in built[delivered:]:
            self._deliver(event)
        return saved

    def _save_turn(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent]) -> AgentTurn:
        """The store's save, carrying the ChatMemory projection when the store can (see `Projection.save`)."""
        return self._projection.save(self.turn_store, turn, expected_version, events)

    def _event(self, body: payloads.EventBody, turn: AgentTurn, version: int, index: int) -> AgentEvent:
        """A durable event of the save that gives `turn` the version `version`."""
        # Every field comes from a validated snapshot or from here: no need to validate again.
        return trusted(
            AgentEvent,
            _EVENT_GIVEN,
            {
                "event_id": f"{turn.id}:{version}:{index}",
                "type": body.type,
                "turn_id": turn.id,
                "root_turn_id": turn.root_turn_id,
                "conversation_id": turn.conversation_id or turn.root_conversation_id,
                "timestamp": self.clock(),
                "data": body.data(turn.status, version),
                "cursor": None,
            },
        )

    def _carried(self, turn_id: str) -> list[AgentEvent]:
        carried: dict[str, list[AgentEvent]] | None = getattr(self._local, "carried", None)
        if carried is None:
            carried = self._local.carried = {}
        return carried.setdefault(turn_id, [])

    def _carry(self, body: payloads.EventBody, turn: AgentTurn) -> None:
        """Deliver a durable event now and save it with the turn's next save (it precedes any save)."""
        carried = self._carried(turn.id)
        event = self._event(body, turn, turn.version + 1, len(carried))
        carried.append(event)
        self._deliver(event)

    def _suspended_event(self, turn: AgentTurn) -> PendingEvent:
        """TURN_SUSPENDED of `turn`, the call's arguments masked as the turn's agent says."""
        return payloads.turn_suspended(turn, self.agent_for(turn).masked_arguments)

    def _projection_failed(self, turn: AgentTurn, error: str) -> None:
        self._emit(payloads.chat_memory_error(error), turn)

    def _emit(self, body: payloads.EventBody, turn: AgentTurn) -> None:
        """Deliver an event that is not saved (MODEL_DELTA, TOOL_PROGRESS, CHAT_MEMORY_ERROR) to the listeners."""
        if not self._listeners:
            return
        self._deliver(
            AgentEvent(
                type=body.type,
                turn_id=turn.id,
                root_turn_id=turn.root_turn_id,
                conversation_id=turn.conversation_id or turn.root_conversation_id,
                data=body.data(turn.status, turn.version),
            )
        )

    def _deliver(self, event: AgentEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                logger.exception("event listener %r raised on %s; the turn goes on", listener, event.type)

    @contextmanager
    def _driving(self, turn_id: str) -> Iterator[None]:
        """Mark `turn_id` as being stepped by this thread for the duration of the block."""
        driving: set[str] | None = getattr(self._local, "driving", None)
        if driving is None:
            driving = self._local.driving = set()
        added = turn_id not in driving
        driving.add(turn_id)
        try:
            yield
        finally:
            if added:
                driving.discard(turn_id)

    def _is_driving(self, turn_id: str) -> bool:
        driving: set[str] | None = getattr(self._local, "driving", None)
        return bool(driving) and turn_id in driving  # type: ignore[operator]


class _CancelledMidCall(Exception):
    """Raised through a streaming model call whose turn was cancelled meanwhile."""


class _DeltaSink:
    """`ChatRequest.on_delta` of one model call: MODEL_DELTA events, and a watch on the cancel flag.

    A cancel of a RUNNING turn only sets its flag. While the answer streams, the flag is
    read at most every `CANCEL_CHECK_S` seconds; once it is seen, the stream is abandoned
    (the model adapter stops reading, so no more tokens are paid for) and the turn ends.
    """

    CANCEL_CHECK_S = 0.5

    def __init__(self, runner: AgentRunner, turn: AgentTurn) -> None:
        self.runner = runner
        self.turn = turn
        self.next_check = time.monotonic() + self.CANCEL_CHECK_S

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + self.CANCEL_CHECK_S
            try:
                cancelled = self.runner.turn_store.get_ref(self.turn.id).cancel_requested
            except AgentRunnerError:
                cancelled = False  # the store is the truth; its blip must not break the stream
            if cancelled:
                raise _CancelledMidCall(self.turn.id)
        # The fence tells the deltas of an abandoned call (its worker died) from the re-run's.
        if self.runner._listeners:
            self.runner._emit(payloads.model_delta(text, self.turn.lease_fence), self.turn)


def _raise_failure(result: AdvanceResult) -> AgentTurn:
    """The turn of an in-thread run; a step's exception reaches the caller, as from any call."""
    if result.error is not None and result.stopped in (StopReason.FAILED, StopReason.LEASE_LOST):
        raise result.error
    return result.turn


def _terminal_event(turn: AgentTurn) -> PendingEvent:
    return payloads.turn_ended(turn, TERMINAL_EVENTS[turn.status]) if turn.is_terminal else None
