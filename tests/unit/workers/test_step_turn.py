"""`step_turn` deliveries against in-memory backends: what each reads from the store and what it enqueues."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_runner import (
    Agent,
    AgentResumeCommand,
    AgentRunner,
    AgentStepResult,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    InMemoryAgentTurnStore,
    InMemoryTurnLease,
    LeaseKeeper,
    Middleware,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    tool,
)
from agent_runner.persistence import TurnRef
from workers.celery_app.dispatch import CeleryDispatcher
from workers.celery_app.names import STEP_TURN
from workers.celery_app.tasks import StepOutcome, deliver_step_turn
from workers.settings import WorkerSettings
from workers.wiring import ProcessBackends


class RecordingApp:
    """Stands in for a Celery app: records what would have been published."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def send_task(self, name: str, args: tuple[Any, ...], **options: Any) -> None:
        self.sent.append((name, args, options))


class CountingReads(InMemoryAgentTurnStore):
    """An in-memory store that counts full loads and header reads."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0
        self.refs = 0

    def load(self, turn_id: str) -> AgentTurn:
        self.loads += 1
        return super().load(turn_id)

    def get_ref(self, turn_id: str) -> TurnRef:
        self.refs += 1
        return super().get_ref(turn_id)


@tool
def lookup(n: int) -> str:
    """Look something up."""
    return f"result {n}"


def two_lookups(request: ChatRequest) -> AiMessage:
    done = sum(1 for m in request.messages if isinstance(m, ToolMessage))
    if done < 2:
        return AiMessage(tool_calls=[ToolCall(id=f"call-{done}", name="lookup", arguments={"n": done})])
    return AiMessage(content="done")


@tool(requires_approval=True)
def refund(n: int) -> str:
    """Refund (needs approval)."""
    return "refunded"


def one_refund(request: ChatRequest) -> AiMessage:
    if not any(isinstance(m, ToolMessage) for m in request.messages):
        return AiMessage(tool_calls=[ToolCall(id="call-0", name="refund", arguments={"n": 1})])
    return AiMessage(content="done")


class ApprovedWhileTheLeaseIsHeld(Middleware):
    """Approves the call as soon as a step suspends the turn, while the task still holds the lease."""

    def __init__(self) -> None:
        self.runner: AgentRunner | None = None

    def wrap_step(self, turn: AgentTurn, call_next: Callable[[AgentTurn], AgentStepResult]) -> AgentStepResult:
        result = call_next(turn)
        if result.turn.status is AgentTurnStatus.WAITING_FOR_APPROVAL and self.runner is not None:
            runner, self.runner = self.runner, None
            runner.submit_resume(turn.id, AgentResumeCommand.approve_tool("call-0"))
        return result


def wiring(
    steps_per_task: int, middleware: list[Middleware] | None = None
) -> tuple[ProcessBackends, CountingReads, RecordingApp]:
    settings = WorkerSettings.from_env({"AGENT_RUNNER_QUEUE": "q", "AGENT_RUNNER_STEPS_PER_TASK": str(steps_per_task)})
    app = RecordingApp()
    store = CountingReads()
    dispatcher = CeleryDispatcher(app, settings)
    runner = AgentRunner(turn_store=store, dispatcher=dispatcher, middleware=middleware or [])
    built = ProcessBackends(
        settings=settings,
        celery_app=app,
        runner=runner,
        turn_store=store,  # type: ignore[arg-type]
        inbox=None,  # type: ignore[arg-type]
        lease=None,  # type: ignore[arg-type]
        guard=None,  # type: ignore[arg-type]
        dispatcher=dispatcher,
        keeper=LeaseKeeper(InMemoryTurnLease(), 30_000),
        live=None,  # type: ignore[arg-type]
        engine=None,  # type: ignore[arg-type]
    )
    return built, store, app


def test_each_delivery_loads_the_turn_once_and_its_follow_up_reads_nothing_more() -> None:
    # Given workers that take two steps per task, and a turn of five steps
    built, store, app = wiring(steps_per_task=2)
    turn = built.runner.start(Agent(id="a", chat_model=ScriptedChatModel(two_lookups), tools=[lookup]), "go")
    assert app.sent == [(STEP_TURN, (turn.id, 0), {"queue": "q"})]
    deliveries = 0
    while app.sent:
        # When each message is delivered in turn
        _, (turn_id, version), _ = app.sent.pop(0)
        store.loads = store.refs = 0
        assert deliver_step_turn(built, turn_id, version) is StepOutcome.STEPPED
        deliveries += 1
        # Then the snapshot was loaded once, under the lease, and the follow-up needed no other read:
        # the turn was still running (its budget ran out) or had ended
        assert (store.loads, store.refs) == (1, 0)
        if deliveries < 3:
            # two steps per delivery, plus the save that took the READY turn off the queue
            assert app.sent == [(STEP_TURN, (turn.id, 2 * deliveries + 1), {"queue": "q"})]
    # And the turn completed in three deliveries, the last of which enqueued nothing
    assert deliveries == 3
    assert store.load(turn.id).status == "COMPLETED"


def test_a_stale_delivery_changes_nothing_and_enqueues_nothing() -> None:
    built, store, app = wiring(steps_per_task=2)
    turn = built.runner.start(Agent(id="a", chat_model=ScriptedChatModel(two_lookups), tools=[lookup]), "go")
    app.sent.clear()
    assert deliver_step_turn(built, turn.id, 0) is StepOutcome.STEPPED
    app.sent.clear()
    assert deliver_step_turn(built, turn.id, 0) is StepOutcome.STALE
    assert app.sent == []
    assert store.load(turn.id).version == 3  # taken off the queue, then two steps


def test_a_turn_resumed_while_the_lease_was_held_gets_a_follow_up_from_one_header_read() -> None:
    # Given a turn whose approval arrives while the task that suspended it still holds the lease
    approve = ApprovedWhileTheLeaseIsHeld()
    built, store, app = wiring(steps_per_task=4, middleware=[approve])
    approve.runner = built.runner
    turn = built.runner.start(Agent(id="a", chat_model=ScriptedChatModel(one_refund), tools=[refund]), "go")
    app.sent.clear()
    store.loads = store.refs = 0
    # When the delivery steps the turn into its suspension
    assert deliver_step_turn(built, turn.id, 0) is StepOutcome.STEPPED
    # Then the follow-up read the header once and enqueued the resumed version (the resume's own
    # message arrived while the lease was held, so a worker would have dropped it)
    resumed = store.load(turn.id)
    assert resumed.status is AgentTurnStatus.RUNNING
    assert store.refs == 1
    assert app.sent[-1] == (STEP_TURN, (turn.id, resumed.version), {"queue": "q"})
