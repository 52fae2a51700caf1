"""Steering a turn while it works (`AgentRunner.steer`), through every store.

The message is accepted by a runner on a store of its own (as another process would),
while the turn's own runner calls the model, runs a tool, or waits for a person; the
model's next request must hold the messages in the order they were accepted, after the
results of every tool call of the answer before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import store
from agent_runner import (
    Agent,
    AgentEvent,
    AgentResumeCommand,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    InMemoryAgentLoader,
    ScriptedChatModel,
    SteeringQueue,
    SteeringRefusedError,
    ToolCall,
    ToolMessage,
    TurnNotFound,
    UserMessage,
    tool,
)
from agent_runner.event_payloads import payload_of
from agent_runner.events import AgentEventType
from agent_runner.persistence import AgentTurnStore, ChatMemoryProvider

S = AgentTurnStatus
E = AgentEventType

RunnerFactory = Callable[[Agent], AgentRunner]


@pytest.fixture
def events() -> list[AgentEvent]:
    return []


@pytest.fixture
def fresh_runner(
    database_url: str | None,
    turn_store: AgentTurnStore,
    chat_memory_provider: ChatMemoryProvider,
    events: list[AgentEvent],
) -> Iterator[RunnerFactory]:
    """A new runner on the same data each call: its own store and chat memory objects on SQL."""
    opened: list[store.SqlAgentTurnStore | store.SqlChatMemoryProvider] = []

    def make(agent: Agent) -> AgentRunner:
        turns, memories = turn_store, chat_memory_provider
        if database_url is not None:
            turns, memories = store.SqlAgentTurnStore(database_url), store.SqlChatMemoryProvider(database_url)
            opened.extend([turns, memories])
        runner = AgentRunner(turn_store=turns, agent_loader=InMemoryAgentLoader([agent]), chat_memory_provider=memories)
        runner.add_event_listener(events.append)
        return runner

    try:
        yield make
        for event in events:
            payload_of(event)  # every event has its type's shape
    finally:
        for item in opened:
            item.close()


def _user_texts_after_last_ai(request: ChatRequest) -> list[str]:
    tail: list[str] = []
    for message in reversed(request.messages):
        if isinstance(message, AiMessage):
            break
        if isinstance(message, UserMessage):
            tail.append(message.content)
    return tail[::-1]


def _assert_tool_protocol(request: ChatRequest) -> None:
    """Every tool call of an AI message is answered right after it, before any other message."""
    messages = request.messages
    for index, message in enumerate(messages):
        if isinstance(message, AiMessage) and message.tool_calls:
            answers = messages[index + 1 : index + 1 + len(message.tool_calls)]
            assert [m.tool_call_id for m in answers if isinstance(m, ToolMessage)] == [
                c.id for c in message.tool_calls
            ], messages


# --- The queue ----------------------------------------------------------------------------------


def test_the_queue_keeps_order_is_idempotent_and_hands_each_message_on_once(
    fresh_runner: RunnerFactory, turn_store: AgentTurnStore, other_turn_store: AgentTurnStore
) -> None:
    agent = Agent("a", chat_model=ScriptedChatModel([AiMessage("done")]))
    turn = fresh_runner(agent).start(agent, "hi")
    assert isinstance(turn_store, SteeringQueue) and isinstance(other_turn_store, SteeringQueue)
    at = turn.created_at
    first, new = turn_store.accept_steering(turn.id, "m1", "one", at)
    assert new and first.message_id == "m1"
    other_turn_store.accept_steering(turn.id, "m2", "two", at)
    again, new = other_turn_store.accept_steering(turn.id, "m1", "changed", at)
    assert not new and again.text == "one"
    turn_store.accept_steering(turn.id, "m3", "three", at)
    assert [m.message_id for m in other_turn_store.steering_messages(turn.id)] == ["m1", "m2", "m3"]

    taken = turn_store.take_unapplied_steering(turn.id, ["m2"])
    assert [m.message_id for m in taken] == ["m1", "m3"]
    assert other_turn_store.take_unapplied_steering(turn.id, ["m2"]) == []
    assert [m.message_id for m in turn_store.steering_messages(turn.id)] == ["m2"]
    with pytest.raises(TurnNotFound):
        turn_store.accept_steering("no-such-turn", "m1", "x", at)


# --- Steering a working turn --------------------------------------------------------------------


def test_messages_sent_during_a_model_call_reach_the_next_request_in_order(fresh_runner: RunnerFactory) -> None:
    holder: dict[str, str] = {}
    requests: list[ChatRequest] = []

    def model(request: ChatRequest) -> AiMessage:
        requests.append(request)
        if len(requests) == 1:
            # Three messages while the first call is in flight, from another runner (process).
            steering = fresh_runner(agent)
            for text in ("use staging", "and the eu region", "quickly"):
                steering.steer(holder["turn"], text)
            return AiMessage("", [ToolCall("c1", "look", {})])
        return AiMessage("done")

    @tool
    def look() -> str:
        """Look."""
        return "looked"

    agent = Agent("a", chat_model=ScriptedChatModel(model), tools=[look])
    runner = fresh_runner(agent)
    turn = runner.start(agent, "deploy")
    holder["turn"] = turn.id
    ended = runner.run_until_blocked(turn)

    assert ended.status is S.COMPLETED
    assert _user_texts_after_last_ai(requests[1]) == ["use staging", "and the eu region", "quickly"]
    _assert_tool_protocol(requests[1])
    assert len(ended.steered_message_ids) == 3


def test_a_message_sent_during_a_tool_call_follows_the_tool_result(fresh_runner: RunnerFactory) -> None:
    holder: dict[str, str] = {}

    @tool
    def slow() -> str:
        """Work."""
        fresh_runner(agent).steer(holder["turn"], "stop after this", message_id="s1")
        return "worked"

    script = ScriptedChatModel(
        [AiMessage("", [ToolCall("c1", "slow", {}), ToolCall("c2", "slow", {})]), AiMessage("ok")]
    )
    agent = Agent("a", chat_model=script, tools=[slow])
    runner = fresh_runner(agent)
    turn = runner.start(agent, "go")
    holder["turn"] = turn.id
    ended = runner.run_until_blocked(turn)

    assert ended.status is S.COMPLETED
    second = script.requests[1]
    _assert_tool_protocol(second)
    # The message came during the first call, but joins only once both calls have results.
    assert [type(m).__name__ for m in second.messages[-4:]] == [
        "AiMessage",
        "ToolMessage",
        "ToolMessage",
        "UserMessage",
    ]
    assert second.messages[-1].id == "s1"


def test_a_final_answer_that_crosses_a_message_does_not_end_the_turn(
    fresh_runner: RunnerFactory, events: list[AgentEvent]
) -> None:
    holder: dict[str, str] = {}
    requests: list[ChatRequest] = []

    def model(request: ChatRequest) -> AiMessage:
        requests.append(request)
        if len(requests) == 1:
            fresh_runner(agent).steer(holder["turn"], "also say bye")
            return AiMessage("hello")
        return AiMessage("hello and bye")

    agent = Agent("a", chat_model=ScriptedChatModel(model))
    runner = fresh_runner(agent)
    turn = runner.start(agent, "greet")
    holder["turn"] = turn.id
    ended = runner.run_until_blocked(turn)

    assert ended.status is S.COMPLETED and ended.final_output == "hello and bye"
    assert [type(m).__name__ for m in requests[1].messages[-3:]] == ["UserMessage", "AiMessage", "UserMessage"]
    assert requests[1].messages[-1].content == "also say bye"
    kinds = [e.type for e in events if e.turn_id == turn.id]
    assert kinds.count(E.STEERING_ACCEPTED) == 1 and kinds.count(E.STEERING_APPLIED) == 1
    assert kinds.index(E.STEERING_APPLIED) < kinds.index(E.TURN_COMPLETED)


def test_a_turn_waiting_for_approval_applies_the_message_when_it_resumes(fresh_runner: RunnerFactory) -> None:
    @tool(requires_approval=True)
    def deploy() -> str:
        """Deploy."""
        return "deployed"

    script = ScriptedChatModel([AiMessage("", [ToolCall("c1", "deploy", {})]), AiMessage("done")])
    agent = Agent("a", chat_model=script, tools=[deploy])
    waiting = fresh_runner(agent).run(agent, "deploy it")
    assert waiting.status is S.WAITING_FOR_APPROVAL

    steered = fresh_runner(agent).steer(waiting.id, "to staging, please")
    assert steered.id == waiting.id and steered.status is S.WAITING_FOR_APPROVAL
    ended = fresh_runner(agent).resume(waiting.id, AgentResumeCommand.approve_tool("c1"))

    assert ended.status is S.COMPLETED
    _assert_tool_protocol(script.requests[1])
    assert _user_texts_after_last_ai(script.requests[1]) == ["to staging, please"]


def test_a_message_accepted_before_its_runner_died_is_applied_by_the_next(fresh_runner: RunnerFactory) -> None:
    script = ScriptedChatModel([AiMessage("ok")])
    agent = Agent("a", chat_model=script)
    turn = fresh_runner(agent).start(agent, "hi")
    fresh_runner(agent).steer(turn.id, "one", message_id="x1")
    fresh_runner(agent).steer(turn.id, "two", message_id="x2")
    fresh_runner(agent).steer(turn.id, "one again", message_id="x1")  # a retried request

    # Nothing of the accepting runners is left: a new one takes the turn over.
    ended = fresh_runner(agent).run_until_blocked(fresh_runner(agent).restore(turn.id))

    assert ended.status is S.COMPLETED
    assert _user_texts_after_last_ai(script.requests[0]) == ["hi", "one", "two"]
    assert ended.steered_message_ids == ["x1", "x2"]


# --- After the end ------------------------------------------------------------------------------


def test_a_message_for_an_ended_conversation_turn_starts_the_next_turn(fresh_runner: RunnerFactory) -> None:
    script = ScriptedChatModel([AiMessage("first answer"), AiMessage("second answer")])
    agent = Agent("a", chat_model=script)
    ended = fresh_runner(agent).run(agent, "hi", conversation_id="conv")
    assert ended.status is S.COMPLETED

    runner = fresh_runner(agent)
    taken = runner.steer(ended.id, "one more thing", message_id="late")
    assert taken.id != ended.id and taken.conversation_id == "conv"
    answered = runner.run_until_blocked(taken)
    assert answered.final_output == "second answer"
    texts = [m.content for m in script.requests[1].messages if isinstance(m, UserMessage)]
    assert texts == ["hi", "one more thing"]


def test_a_message_for_a_tenants_ended_turn_stays_in_that_tenants_conversation(fresh_runner: RunnerFactory) -> None:
    script = ScriptedChatModel([AiMessage("acme's answer"), AiMessage("acme's second answer")])
    agent = Agent("a", chat_model=script)
    runner = fresh_runner(agent)
    # Another tenant (here: none) has an active turn in a conversation of the same id
    other = runner.start(agent, "someone else's", conversation_id="conv")
    ended = runner.run(agent, "hi", conversation_id="conv", tenant_id="acme")
    assert ended.status is S.COMPLETED

    taken = runner.steer(ended.id, "one more thing", message_id="late")
    assert taken.id not in (ended.id, other.id)
    assert (taken.conversation_id, taken.tenant_id) == ("conv", "acme")
    assert runner.turn_store.load(other.id).steered_message_ids == []


def test_a_message_for_an_ended_turn_outside_a_conversation_is_refused(fresh_runner: RunnerFactory) -> None:
    agent = Agent("a", chat_model=ScriptedChatModel([AiMessage("done")]))
    ended = fresh_runner(agent).run(agent, "hi")
    with pytest.raises(SteeringRefusedError):
        fresh_runner(agent).steer(ended.id, "too late")


def test_messages_a_turn_ended_without_go_to_the_conversation_next_turn_in_order(
    fresh_runner: RunnerFactory, events: list[AgentEvent]
) -> None:
    holder: dict[str, str] = {}

    @tool
    def last() -> str:
        """The call after which the turn reaches its limit of model calls."""
        steering = fresh_runner(agent)
        steering.steer(holder["turn"], "first late", message_id="l1")
        steering.steer(holder["turn"], "second late", message_id="l2")
        return "ok"

    script = ScriptedChatModel([AiMessage("", [ToolCall("c1", "last", {})]), AiMessage("after")])
    agent = Agent("a", chat_model=script, tools=[last], max_iterations=1)
    runner = fresh_runner(agent)
    turn = runner.start(agent, "go", conversation_id="conv")
    holder["turn"] = turn.id
    ended = runner.run_until_blocked(turn)
    assert ended.status is S.MAX_ITERATIONS_REACHED

    handed = [e for e in events if e.type is E.STEERING_NOT_APPLIED]
    assert len(handed) == 1 and handed[0].data["message_ids"] == ["l1", "l2"]
    next_id = handed[0].data["next_turn_id"]
    following = fresh_runner(agent).turn_store.load(next_id)
    assert following.conversation_id == "conv" and following.messages[-1].content == "first late"
    answered = runner.run_until_blocked(following)
    assert _user_texts_after_last_ai(script.requests[1]) == ["first late", "second late"]
    assert answered.status is S.COMPLETED
