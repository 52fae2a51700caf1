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
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_runner import machine, telemetry  # telemetry hook: trace context of new turns
from agent_runner._base import new_id, utcnow
from agent_runner.agent import Agent, InMemoryAgentLoader
from agent_runner.errors import (
    AgentConversationBusyException,
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
from agent_runner.in_memory import InMemoryAgentTurnStore
from agent_runner.messages import (
    ActionStatus,
    AgentActionMessage,
    AgentFormMessage,
    AiMessage,
    AnyMessage,
    ModelMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runner.middleware import Middleware, chain
from agent_runner.models import ChatRequest, ChatResponse
from agent_runner.persistence import (
    AgentLoader,
    AgentTurnStore,
    ChatMemory,
    ChatMemoryProvider,
    ConversationGuard,
    Lease,
    TurnDispatcher,
)
from agent_runner.policy import AgentExecutionPolicy
from agent_runner.snapshot import AgentTurn, AgentTurnStatus, ChildLink, PageAction
from agent_runner.suspensions import AgentResumeCommand, AgentSuspension, ResumeType, SuspensionType
from agent_runner.tools import Tool, encode_tool_result, tool_scope

logger = logging.getLogger("agent_runner")

S = AgentTurnStatus
_CAS_ATTEMPTS = 20

LeaseScope = Callable[[str], AbstractContextManager[Lease | None]]
"""Holds a turn's lease for the duration of a `with` block.

It yields the lease, or None when another holder advanced the turn until it stopped being
runnable (so there is nothing left to step)."""

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
            ended) are handed to it instead of being run in this thread.
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
        self.chat_memory_provider = chat_memory_provider
        self.policy = policy if policy is not None else AgentExecutionPolicy()
        self.middleware = list(middleware)
        for item in self.middleware:
            if not isinstance(item, Middleware):
                raise DefinitionError(f"{item!r} is not a Middleware; subclass agent_runner.Middleware")
        self.dispatcher = dispatcher
        self.conversation_guard = conversation_guard
        self.clock = clock
        self.lease_scope = lease_scope
        self._listeners: list[AgentEventListener] = []
        self._local = threading.local()

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
    ) -> AgentTurn:
        """Create and save a READY turn without running it (a worker picks it up); arguments as for `run`."""
        turn = self._create(
            agent, message, history=history, conversation_id=conversation_id, tenant_id=tenant_id, metadata=metadata
        )
        self._dispatch(turn)
        return turn

    def restore(self, turn_id: str) -> AgentTurn:
        """Load a turn from the store, check its agent is known, and redo any projection that failed.

        Raises:
            TurnNotFound: No such turn.
            AgentNotFound: The loader does not know the turn's agent and version.
        """
        turn = self.turn_store.load(turn_id)
        self.agent_loader.load(turn.agent_id, turn.agent_version)
        turn = self._project(turn)
        if turn.status is S.WAITING_FOR_CHILD:
            turn = self._reconcile_children(turn)
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
            return self._run_until_blocked(turn)
        # Workers poll the store for READY and RUNNING turns: stepping here without the
        # lease could call the model or a tool twice, once here and once on a worker.
        with scope(turn.id) as lease:
            if lease is None:
                return self.turn_store.load(turn.id)
            # The snapshot passed in may predate a holder that worked on the turn while this
            # thread waited for the lease; continue from the stored one, under our fence.
            current = self.turn_store.load(turn.id)
            return self._run_until_blocked(current.model_copy(update={"lease_fence": lease.fence}))

    def _run_until_blocked(self, turn: AgentTurn) -> AgentTurn:
        first = True
        with self._driving(turn.id):
            while True:
                if turn.cancel_requested and not turn.is_terminal and not turn.is_runnable(self.clock()):
                    turn = self._cancel_waiting(turn)
                    break
                runnable = turn.status in (S.READY, S.RUNNING) or (first and turn.is_runnable(self.clock()))
                if not runnable:
                    break
                first = False
                result = self.step(turn)
                if isinstance(result.error, VersionConflictError):
                    turn = result.turn
                    break
                turn = result.turn
                if turn.status is S.WAITING_FOR_CHILD and self.dispatcher is None:
                    turn = self._drive_children(turn)
        if turn.is_terminal and turn.parent_turn_id is not None:
            self._after_child_ended(turn)
        return turn

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
            self._dispatch(turn)
        return turn

    def cancel(self, turn_id: str, reason: str | None = None) -> AgentTurn:
        """Cancel a turn and its children.

        A READY, waiting or RETRY_SCHEDULED turn ends at once (CANCELLED, history closed out).
        A RUNNING turn gets a durable cancel flag and the thread stepping it ends it at its
        next boundary. A turn that already ended is returned unchanged.
        """
        reason = reason or self.policy.cancellation_reason
        for _ in range(_CAS_ATTEMPTS):
            turn = self.turn_store.load(turn_id)
            if turn.is_terminal:
                return turn
            if turn.status is S.RUNNING:
                flagged = self.turn_store.request_cancel(turn_id)
                if flagged.status is S.RUNNING:
                    return flagged
                continue  # it blocked or ended meanwhile: cancel that state instead
            try:
                return self._finish(turn, S.CANCELLED, reason)
            except VersionConflictError:
                continue
        raise VersionConflictError(turn_id, -1, None)

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
        now = self.clock()
        suspended = machine.apply_suspension(turn, machine.Suspend(suspension, None), now, count_step=False)
        saved = self._save(suspended, turn.version)
        self._emit(AgentEventType.TURN_SUSPENDED, saved, **_suspension_data(suspension))
        return saved

    # --- Creation ----------------------------------------------------------------------------

    def _resolve_agent(self, agent: Agent | str) -> Agent:
        if isinstance(agent, Agent):
            register = getattr(self.agent_loader, "register", None)
            if callable(register):
                register(agent)
            return agent
        return self.agent_loader.load(agent)

    def agent_for(self, turn: AgentTurn) -> Agent:
        """The agent definition of a turn, from the loader."""
        return self.agent_loader.load(turn.agent_id, turn.agent_version)

    def _create(
        self,
        agent_ref: Agent | str,
        message: str | UserMessage,
        *,
        history: Sequence[ModelMessage] | None,
        conversation_id: str | None,
        tenant_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AgentTurn:
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
            window = self._memory(conversation_id).get_model_messages(agent.max_attached_messages)
        turn_id = new_id()
        now = self.clock()
        turn = AgentTurn(
            id=turn_id,
            agent_id=agent.id,
            agent_version=agent.version,
            conversation_id=conversation_id,
            root_turn_id=turn_id,
            messages=[*window, user],
            projected_count=len(window),
            tenant_id=tenant_id,
            metadata=dict(metadata or {}),
            created_at=now,
            updated_at=now,
        )
        turn = telemetry.stamp_new_turn(self, turn)  # telemetry hook: trace context of the new turn
        saved = self._create_saved(turn)
        self._emit(AgentEventType.TURN_STARTED, saved, agent_id=agent.id, agent_version=agent.version)
        return self._project(saved)

    def _create_saved(self, turn: AgentTurn) -> AgentTurn:
        conversation = turn.conversation_id
        guard = self.conversation_guard
        if conversation is None or guard is None:
            return self.turn_store.save(turn, -1)
        self._claim_guard(guard, conversation, turn.id)
        try:
            return self.turn_store.save(turn, -1)
        except AgentConversationBusyException as busy:
            # The guard had lost track (for example Redis lost its data): repair it from the store.
            self._guard_call(guard.replace, conversation, turn.id, busy.active_turn_id)
            raise
        except BaseException:
            self._guard_call(guard.release, conversation, turn.id)
            raise

    def _claim_guard(self, guard: ConversationGuard, conversation: str, turn_id: str) -> None:
        holder = self._guard_call(guard.claim, conversation, turn_id)
        if holder is None or holder == turn_id:
            return
        active = self.turn_store.find_active_turn(conversation)
        if active is not None:
            raise AgentConversationBusyException(conversation, active.id, active.status)
        # The holder ended (its release was lost): take the mark over; the store's unique
        # index still decides if two creators race here.
        self._guard_call(guard.replace, conversation, holder, turn_id)

    def _guard_call(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(*args)
        except AgentRunnerError as exc:
            logger.warning("conversation guard unavailable, relying on the turn store: %s", exc)
            return None

    # --- Stepping ----------------------------------------------------------------------------

    def _step(self, turn: AgentTurn) -> AgentStepResult:
        now = self.clock()
        if not turn.is_runnable(now):
            return AgentStepResult(turn=turn)
        expected = turn.version
        if turn.status is S.RETRY_SCHEDULED:
            self._emit(AgentEventType.TURN_RESUMED, turn, reason="retry due", attempt=turn.attempt)
        agent = self.agent_for(turn)
        running = machine.start_running(turn, now)
        plan = machine.plan_step(running, agent, self.policy)
        try:
            match plan:
                case machine.Terminate(status=status, reason=reason):
                    return AgentStepResult(turn=self._finish(running, status, reason, expected_version=expected))
                case machine.CallModel():
                    return self._call_model(running, agent, expected)
                case machine.ExecuteTool(call=call, tool=tool):
                    return self._execute_tool(running, call, tool, expected)
                case machine.WriteToolResult(call=call, content=content, is_error=is_error):
                    updated, message = machine.apply_tool_result(running, call, content, is_error, now)
                    saved = self._save(updated, expected)
                    self._emit(
                        AgentEventType.TOOL_COMPLETED,
                        saved,
                        tool_call_id=call.id,
                        tool_name=call.name,
                        is_error=is_error,
                    )
                    return AgentStepResult(turn=saved, tool_messages=[message])
                case machine.Suspend():
                    saved = self._save(machine.apply_suspension(running, plan, now), expected)
                    self._emit(AgentEventType.TURN_SUSPENDED, saved, **_suspension_data(plan.suspension))
                    return AgentStepResult(turn=saved)
                case machine.SpawnChildren(calls=calls):
                    return AgentStepResult(turn=self._spawn_children(running, calls, expected))
        except VersionConflictError as conflict:
            # Someone else advanced the turn (a resume, a cancel, another worker): never
            # overwrite it; hand back the newer snapshot.
            return AgentStepResult(turn=self.turn_store.load(turn.id), error=conflict)
        raise AssertionError(f"unhandled plan {plan!r}")  # pragma: no cover

    def _call_model(self, turn: AgentTurn, agent: Agent, expected: int) -> AgentStepResult:
        if agent.chat_model is None:
            raise DefinitionError(f"agent {agent.id!r} has no chat_model")
        chat_model = agent.chat_model
        request = ChatRequest.model_construct(
            messages=self._request_messages(turn, agent),
            tools=agent.tool_specs(),
            on_delta=(lambda text: self._emit(AgentEventType.MODEL_DELTA, turn, delta=text))
            if self._listeners
            else None,
        )
        try:
            raw: object = chain(self.middleware, "wrap_model", chat_model.generate)(request)
            # Lenient with hand-written models and middleware that return a bare AiMessage.
            response = ChatResponse(message=raw) if isinstance(raw, AiMessage) else raw
            if not isinstance(response, ChatResponse):
                raise DefinitionError(f"chat model returned {type(response).__name__}, expected ChatResponse")
        except Exception as exc:
            return self._failed_call(turn, exc, expected)
        now = self.clock()
        updated, message = machine.apply_model_response(turn, response, now)
        saved = self._save(updated, expected)
        response = ChatResponse.model_construct(message=message, usage=response.usage)
        self._emit(
            AgentEventType.MODEL_RESPONSE,
            saved,
            message_id=message.id,
            tool_calls=[c.name for c in message.tool_calls],
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
        )
        if saved.is_terminal:
            self._after_terminal(saved)
        return AgentStepResult(turn=saved, response=response)

    def _request_messages(self, turn: AgentTurn, agent: Agent) -> list[ModelMessage]:
        messages: list[ModelMessage] = []
        if agent.instructions:
            messages.append(SystemMessage(id=f"{agent.id}-instructions", content=agent.instructions))
        messages.extend(turn.messages)
        return messages

    def _execute_tool(self, turn: AgentTurn, call: ToolCall, tool: Tool, expected: int) -> AgentStepResult:
        self._emit(AgentEventType.TOOL_STARTED, turn, tool_call_id=call.id, tool_name=call.name)
        submitted = turn.form_data.get(call.id, {})

        def progress(data: Any) -> None:
            self._emit(AgentEventType.TOOL_PROGRESS, turn, tool_call_id=call.id, tool_name=call.name, progress=data)

        def invoke(tool_call: ToolCall) -> Any:
            with tool_scope(turn.id, tool_call, submitted, progress):
                return tool.invoke(tool_call.arguments)

        is_error = False
        try:
            content = encode_tool_result(chain(self.middleware, "wrap_tool", invoke)(call))
        except ToolError as exc:
            content, is_error = str(exc), True
        except AgentFormRequiredException as exc:
            if call.id in turn.form_data:
                error = FormProtocolError(turn.id, call.id, exc.form.key)
                failed = self._finish(turn, S.FAILED, str(error), expected_version=expected)
                return AgentStepResult(turn=failed, error=error)
            plan = machine.form_suspension(turn, call, exc.form, machine.FORM_SOURCE_TOOL, exc.message)
            saved = self._save(machine.apply_suspension(turn, plan, self.clock()), expected)
            self._emit(AgentEventType.TURN_SUSPENDED, saved, **_suspension_data(plan.suspension))
            return AgentStepResult(turn=saved)
        except Exception as exc:
            return self._failed_call(turn, exc, expected)
        updated, message = machine.apply_tool_result(turn, call, content, is_error, self.clock())
        saved = self._save(updated, expected)
        self._emit(AgentEventType.TOOL_COMPLETED, saved, tool_call_id=call.id, tool_name=call.name, is_error=is_error)
        return AgentStepResult(turn=saved, tool_messages=[message])

    def _failed_call(self, turn: AgentTurn, exc: Exception, expected: int) -> AgentStepResult:
        """A model or tool call raised: retry later if recoverable and attempts remain, else fail."""
        if isinstance(exc, VersionConflictError):
            raise exc
        description = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, RecoverableError):
            now = self.clock()
            delay = self.policy.retry.backoff(turn.attempt + 1, exc.retry_after)
            scheduled = machine.schedule_retry(turn, description, delay, self.policy, now)
            if scheduled is not None:
                saved = self._save(scheduled, expected)
                self._emit(
                    AgentEventType.RETRY_SCHEDULED,
                    saved,
                    attempt=saved.attempt,
                    next_retry_at=saved.next_retry_at.isoformat() if saved.next_retry_at else None,
                    error=description,
                )
                self._dispatch(saved)
                return AgentStepResult(turn=saved, error=exc)
            description = f"gave up after {turn.attempt + 1} attempts: {description}"
        failed = self._finish(turn, S.FAILED, description, expected_version=expected, steps=turn.steps + 1)
        return AgentStepResult(turn=failed, error=exc)

    def _finish(
        self,
        turn: AgentTurn,
        status: AgentTurnStatus,
        reason: str,
        *,
        expected_version: int | None = None,
        steps: int | None = None,
    ) -> AgentTurn:
        """Close out and save a terminal snapshot, then cascade to children, guard and parent."""
        expected = turn.version if expected_version is None else expected_version
        ended = machine.close_out(turn, status, reason, self.policy, self.clock())
        if steps is not None:
            ended = ended.model_copy(update={"steps": steps})
        saved = self._save(ended, expected)
        self._after_terminal(saved)
        return saved

    def _after_terminal(self, turn: AgentTurn) -> None:
        self._emit(TERMINAL_EVENTS[turn.status], turn, error=turn.error, final_output=turn.final_output)
        for link in turn.children:
            if link.status is None:
                try:
                    self.cancel(link.child_turn_id, turn.error or self.policy.cancellation_reason)
                except AgentRunnerError as exc:
                    logger.warning("could not cancel child turn %s: %s", link.child_turn_id, exc)
        if turn.conversation_id is not None and self.conversation_guard is not None:
            self._guard_call(self.conversation_guard.release, turn.conversation_id, turn.id)
        if turn.parent_turn_id is not None and not self._is_driving(turn.id):
            # A child that ended outside a run loop (cancelled, resumed elsewhere) tells its parent now.
            self._after_child_ended(turn)

    def _cancel_waiting(self, turn: AgentTurn) -> AgentTurn:
        try:
            return self._finish(turn, S.CANCELLED, self.policy.cancellation_reason)
        except VersionConflictError:
            return self.cancel(turn.id)

    # --- Child turns -------------------------------------------------------------------------

    def _spawn_children(
        self, parent: AgentTurn, calls: tuple[tuple[ToolCall, Agent, str], ...], expected: int
    ) -> AgentTurn:
        now = self.clock()
        links: list[ChildLink] = []
        children: list[AgentTurn] = []
        for call, sub_agent, task in calls:
            child_id = machine.child_turn_id(parent.id, call.id)
            child = AgentTurn(
                id=child_id,
                agent_id=sub_agent.id,
                agent_version=sub_agent.version,
                parent_turn_id=parent.id,
                root_turn_id=parent.root_turn_id,
                messages=[UserMessage(id=f"{child_id}-0", content=task)],
                tenant_id=parent.tenant_id,
                created_at=now,
                updated_at=now,
            )
            child = telemetry.stamp_new_turn(self, child)  # telemetry hook: trace context of the child turn
            try:
                child = self.turn_store.save(child, -1)
                self._emit(AgentEventType.TURN_STARTED, child, agent_id=sub_agent.id, parent_turn_id=parent.id)
            except VersionConflictError:
                child = self.turn_store.load(child_id)  # created by an earlier run of this same step
            links.append(ChildLink(tool_call_id=call.id, agent_id=sub_agent.id, child_turn_id=child_id))
            children.append(child)
        waiting = machine.apply_children_spawned(parent, links, now)
        saved = self._save(waiting, expected)
        self._emit(AgentEventType.TURN_SUSPENDED, saved, **_suspension_data(saved.suspension))
        # Children may have ended before the parent's save (another worker ran them): record those now.
        saved = self._reconcile_children(saved)
        for child in children:
            if not child.is_terminal:
                self._dispatch(child)
        return saved

    def _drive_children(self, parent: AgentTurn) -> AgentTurn:
        """Run the parent's unfinished children in this thread, then return the parent's latest snapshot."""
        for link in parent.children:
            if link.status is None:
                child = self.turn_store.load(link.child_turn_id)
                if child.is_runnable(self.clock()):
                    self.run_until_blocked(child)
        return self.turn_store.load(parent.id)

    def _after_child_ended(self, child: AgentTurn) -> None:
        """Record an ended child in its parent; the save that records the last child resumes the parent."""
        assert child.parent_turn_id is not None
        parent = self._record_child(child.parent_turn_id, child)
        if parent is None or not parent.is_runnable(self.clock()):
            return
        if self.dispatcher is not None:
            self._dispatch(parent)
        elif not self._is_driving(parent.id):
            self.run_until_blocked(parent)

    def _record_child(self, parent_id: str, child: AgentTurn) -> AgentTurn | None:
        """Apply `child_completed` to the parent with compare-and-swap; None when not applicable (yet)."""
        command = AgentResumeCommand.child_completed(child.id)
        for _ in range(_CAS_ATTEMPTS):
            parent = self.turn_store.load(parent_id)
            link = next((c for c in parent.children if c.child_turn_id == child.id), None)
            if parent.status is not S.WAITING_FOR_CHILD or link is None or link.status is not None:
                # Not waiting yet (its own save will reconcile), or already recorded by someone else.
                return None
            try:
                resumed = machine.apply_resume(parent, command, self.clock(), child=child)
                saved = self._save(resumed, parent.version)
            except VersionConflictError:
                continue
            if saved.status is S.RUNNING:
                self._emit(
                    AgentEventType.TURN_RESUMED, saved, command=ResumeType.CHILD_COMPLETED, child_turn_id=child.id
                )
                return saved
            return None
        raise VersionConflictError(parent_id, -1, None)

    def _reconcile_children(self, parent: AgentTurn) -> AgentTurn:
        """Record every child that ended but is not recorded yet (after a crash or a lost race)."""
        for link in parent.children:
            if link.status is None:
                child = self.turn_store.load(link.child_turn_id)
                if child.is_terminal:
                    self._record_child(parent.id, child)
        return self.turn_store.load(parent.id)

    def reconcile_children(self, turn_id: str) -> AgentTurn:
        """Recover a parent stuck in WAITING_FOR_CHILD whose children all ended (used by sweeps)."""
        parent = self._reconcile_children(self.turn_store.load(turn_id))
        if parent.is_runnable(self.clock()):
            self._dispatch(parent)
        return parent

    # --- Resume ------------------------------------------------------------------------------

    def _apply_resume(self, turn_id: str, command: AgentResumeCommand) -> AgentTurn:
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
            recorded = self._record_child(turn_id, child)
            return recorded if recorded is not None else self.turn_store.load(turn_id)
        for _ in range(_CAS_ATTEMPTS):
            turn = self.turn_store.load(turn_id)
            resumed = machine.apply_resume(turn, command, self.clock())
            try:
                saved = self._save(resumed, turn.version)
            except VersionConflictError:
                continue  # re-validate against the newer snapshot: a concurrent decision wins once
            self._emit(
                AgentEventType.TURN_RESUMED,
                saved,
                command=command.type,
                tool_call_id=command.tool_call_id,
                metadata=command.metadata,
            )
            return saved
        raise VersionConflictError(turn_id, -1, None)

    # --- Persistence, projection, events -----------------------------------------------------

    def _save(self, turn: AgentTurn, expected_version: int) -> AgentTurn:
        saved = self.turn_store.save(turn, expected_version)
        if saved.conversation_id is not None:
            saved = self._project(saved)
        return saved

    def _memory(self, conversation_id: str) -> ChatMemory:
        if self.chat_memory_provider is None:
            raise DefinitionError("conversation turns need AgentRunner(chat_memory_provider=...)")
        return self.chat_memory_provider(conversation_id)

    def _project(self, turn: AgentTurn) -> AgentTurn:
        """Copy new messages and page-action states of a saved turn into its ChatMemory.

        Messages before `projected_count` and actions marked `synced` are known to be in
        ChatMemory; everything after is (re)applied. Idempotent (stable ids, compare-and-swap
        updates), so a retry after a crash never duplicates. A failure is reported as a CHAT_MEMORY_ERROR event and retried after the
        next save or on `restore`; it never fails the turn, whose store is the truth.
        """
        if turn.conversation_id is None or self.chat_memory_provider is None:
            return turn
        start = turn.projected_count
        new = [m for m in turn.messages[start:] if not isinstance(m, SystemMessage)]
        unsynced = [a for a in turn.page_actions if not a.synced]
        if not new and not unsynced and start == len(turn.messages):
            return turn
        try:
            memory = self._memory(turn.conversation_id)
            if new:
                memory.append(new)
            actions = list(turn.page_actions)
            for index, action in enumerate(actions):
                if action.synced:
                    continue
                self._sync_page_action(memory, action)
                actions[index] = action.model_copy(update={"synced": True})
        except Exception as exc:
            logger.warning("projecting turn %s into ChatMemory failed: %s", turn.id, exc)
            self._emit(AgentEventType.CHAT_MEMORY_ERROR, turn, error=f"{type(exc).__name__}: {exc}")
            return turn
        return turn.model_copy(update={"projected_count": len(turn.messages), "page_actions": actions})

    def _sync_page_action(self, memory: ChatMemory, action: PageAction) -> None:
        for _ in range(_CAS_ATTEMPTS):
            stored = memory.get(action.message_id)
            if stored is None:
                message = _page_message(action.payload, action.status)
                memory.append([message])
                stored = memory.get(action.message_id)
                if stored is None or stored.status == action.status:  # type: ignore[union-attr]
                    return
            if not isinstance(stored, AgentActionMessage | AgentFormMessage) or stored.status == action.status:
                return
            try:
                memory.update(stored.model_copy(update={"status": action.status}), stored.version)
                return
            except VersionConflictError:
                continue

    def _emit(self, event_type: AgentEventType, turn: AgentTurn, **data: Any) -> None:
        if not self._listeners:
            return
        event = AgentEvent(
            type=event_type,
            turn_id=turn.id,
            root_turn_id=turn.root_turn_id,
            conversation_id=turn.conversation_id,
            data={"status": turn.status.value, "version": turn.version, **data},
        )
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                logger.exception("event listener %r raised on %s; the turn goes on", listener, event_type)

    def _dispatch(self, turn: AgentTurn) -> None:
        if self.dispatcher is not None:
            self.dispatcher.dispatch(turn)

    @contextmanager
    def _driving(self, turn_id: str) -> Iterator[None]:
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


def _page_message(payload: dict[str, Any], status: ActionStatus) -> AnyMessage:
    data = {**payload, "status": status}
    if payload.get("role") == "agent_form":
        return AgentFormMessage.model_validate(data)
    return AgentActionMessage.model_validate(data)


def _suspension_data(suspension: AgentSuspension | None) -> dict[str, Any]:
    if suspension is None:
        return {}
    data: dict[str, Any] = {
        "suspension_type": suspension.type.value,
        "correlation_id": suspension.correlation_id,
        "message": suspension.message,
    }
    if suspension.type is SuspensionType.USER_INPUT and suspension.form is not None:
        data["form_key"] = suspension.form.key
    return data
