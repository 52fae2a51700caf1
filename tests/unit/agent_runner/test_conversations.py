"""Conversation mode: history window, one active turn per conversation, page messages, projection."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from agent_runner import (
    ActionStatus,
    Agent,
    AgentActionMessage,
    AgentConversationBusyException,
    AgentEventType,
    AgentExecutionPolicy,
    AgentFormMessage,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    AnyMessage,
    ChatRequest,
    DefinitionError,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    InMemoryChatMemory,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    ModelMessage,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    StoreUnavailableError,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    VersionConflictError,
    tool,
)
from tests.unit.agent_runner.turn_kit import (
    TICKET_FORM,
    TICKET_SCHEMA,
    VALID_TICKET,
    EventLog,
    FakeClock,
    protocol_violations,
    ticket_scenario,
)

S = AgentTurnStatus
MODEL_ROLES = {"system", "user", "assistant", "tool"}


def _page_messages(memory: InMemoryChatMemory) -> list[AgentActionMessage | AgentFormMessage]:
    return [m for m in memory.get_messages(10_000) if isinstance(m, AgentActionMessage | AgentFormMessage)]


def _model_ids(memory: InMemoryChatMemory) -> list[str]:
    return [m.id for m in memory.get_messages(10_000) if m.model_visible]


# --- History window ---------------------------------------------------------------------------


def test_the_model_sees_the_memory_window_then_the_new_user_message() -> None:
    # Given: a conversation whose memory holds earlier messages and a page message
    provider = InMemoryChatMemoryProvider()
    memory = provider("c-1")
    earlier: list[AnyMessage] = [
        UserMessage(content="u1"),
        AiMessage(content="a1"),
        UserMessage(content="u2"),
        AiMessage(tool_calls=[ToolCall(id="t1", name="lookup", arguments={})]),
        ToolMessage(tool_call_id="t1", tool_name="lookup", content="r1"),
        AiMessage(content="a3"),
        AgentActionMessage(turn_id="old", action_id="t0", tool_name="x", summary="x()"),
        UserMessage(content="u3"),
        AiMessage(content="a4"),
    ]
    memory.append(earlier)
    model = ScriptedChatModel([AiMessage(content="answer")])
    agent = Agent(id="chat", instructions="Be brief.", chat_model=model, max_attached_messages=4)
    # When: a new turn runs in the conversation
    turn = AgentRunner(chat_memory_provider=provider).run(agent, "u4", conversation_id="c-1")
    # Then: the request holds the instructions, the newest 4 model messages minus the orphan ToolMessage, then u4
    sent = model.requests[0].messages
    assert isinstance(sent[0], SystemMessage)
    assert [m.content for m in sent[1:]] == ["a3", "u3", "a4", "u4"]
    assert protocol_violations(sent) == []
    assert turn.status is S.COMPLETED and turn.conversation_id == "c-1"


def test_a_conversation_turn_projects_its_messages_into_memory_with_their_ids_except_the_system_message() -> None:
    provider = InMemoryChatMemoryProvider()
    model = ScriptedChatModel([AiMessage(content="hello there")])
    turn = AgentRunner(chat_memory_provider=provider).run(
        Agent(id="chat", instructions="Be brief.", chat_model=model), "hi", conversation_id="c-1"
    )
    stored = provider("c-1").get_messages(100)
    assert [m.id for m in stored] == [m.id for m in turn.messages]
    assert [m.role for m in stored] == ["user", "assistant"]


def test_the_next_turn_of_a_conversation_sees_the_previous_one() -> None:
    provider = InMemoryChatMemoryProvider()
    model = ScriptedChatModel([AiMessage(content="first answer"), AiMessage(content="second answer")])
    runner = AgentRunner(chat_memory_provider=provider)
    agent = Agent(id="chat", chat_model=model)
    runner.run(agent, "first", conversation_id="c-1")
    runner.run(agent, "second", conversation_id="c-1")
    assert [m.content for m in model.requests[1].messages] == ["first", "first answer", "second"]


def test_explicit_history_and_a_conversation_cannot_be_combined() -> None:
    runner = AgentRunner(chat_memory_provider=InMemoryChatMemoryProvider())
    with pytest.raises(DefinitionError):
        runner.run(Agent(id="chat", chat_model=ScriptedChatModel([])), "x", history=[], conversation_id="c-1")
    assert runner.turn_store.find_active_turn("c-1") is None


# --- One active turn per conversation ---------------------------------------------------------


def _approval_model() -> ScriptedChatModel:
    return ScriptedChatModel(
        lambda request: AiMessage(tool_calls=[ToolCall(id="p1", name="publish", arguments={"text": "x"})])
    )


@tool(requires_approval=True)
def publish(text: str) -> str:
    """Publish a text."""
    return "published"


@pytest.mark.parametrize("entry", ["start", "run"])
def test_thirty_threads_racing_on_one_conversation_start_exactly_one_turn(entry: str) -> None:
    # Given: one shared store and memory, and 30 runners about to start a turn in the same conversation
    store = InMemoryAgentTurnStore()
    provider = InMemoryChatMemoryProvider()
    agent = Agent(id="racer", chat_model=_approval_model(), tools=[publish])
    barrier = threading.Barrier(30)
    winners: list[AgentTurn] = []
    busy: list[AgentConversationBusyException] = []
    other: list[BaseException] = []
    lock = threading.Lock()

    def race(index: int) -> None:
        runner = AgentRunner(turn_store=store, chat_memory_provider=provider)
        barrier.wait()
        try:
            turn = getattr(runner, entry)(agent, f"message {index}", conversation_id="c")
        except AgentConversationBusyException as exc:
            with lock:
                busy.append(exc)
        except BaseException as exc:  # anything else is a failure of the test
            with lock:
                other.append(exc)
        else:
            with lock:
                winners.append(turn)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then: exactly one turn was created; every other caller was told which turn is active
    assert other == []
    assert len(winners) == 1 and len(busy) == 29
    [winner] = winners
    assert all(e.conversation_id == "c" and e.active_turn_id == winner.id for e in busy)
    assert all(not S(e.status).is_terminal for e in busy)
    active = store.find_active_turn("c")
    assert active is not None and active.id == winner.id
    assert [t.id for t in store.list_turns(conversation_id="c")] == [winner.id]
    user_texts = [m.content for m in provider("c").get_messages(100) if isinstance(m, UserMessage)]
    assert len(user_texts) == 1


def _sub_needing_approval() -> Agent:
    return Agent(id="deputy_agent", chat_model=_approval_model(), tools=[publish])


def _turn_in_status(status: AgentTurnStatus, runner: AgentRunner) -> AgentTurn:
    """Start a conversation turn in conversation "c" and bring it to `status`."""
    model_for: dict[AgentTurnStatus, Sequence[AiMessage | BaseException]] = {
        S.READY: [],
        S.RUNNING: [AiMessage(tool_calls=[ToolCall(id="p1", name="publish", arguments={"text": "x"})])],
        S.WAITING_FOR_USER: [
            AiMessage(tool_calls=[ToolCall(id="u1", name="request_user_input", arguments={"formKey": TICKET_FORM.key})])
        ],
        S.WAITING_FOR_APPROVAL: [AiMessage(tool_calls=[ToolCall(id="p1", name="publish", arguments={"text": "x"})])],
        S.WAITING_FOR_CHILD: [
            AiMessage(tool_calls=[ToolCall(id="d1", name="deputy_agent", arguments={"task": "publish x"})])
        ],
        S.RETRY_SCHEDULED: [RecoverableError("timeout")],
    }
    agent = Agent(
        id="busy",
        chat_model=ScriptedChatModel([*model_for[status], AiMessage(content="next turn answer")]),
        tools=[publish, AgentUserInputTool(forms=[TICKET_FORM])],
        sub_agents=[_sub_needing_approval()],
    )
    turn = runner.start(agent, "first", conversation_id="c")
    if status is S.RUNNING:
        turn = runner.step(turn).turn
    elif status is not S.READY:
        turn = runner.run_until_blocked(turn)
    assert turn.status is status
    return turn


ACTIVE_STATUSES = [
    S.READY,
    S.RUNNING,
    S.WAITING_FOR_USER,
    S.WAITING_FOR_APPROVAL,
    S.WAITING_FOR_CHILD,
    S.RETRY_SCHEDULED,
]


@pytest.mark.parametrize("status", ACTIVE_STATUSES)
def test_a_non_terminal_turn_blocks_its_conversation_until_it_ends(status: AgentTurnStatus) -> None:
    # Given: a conversation turn in an active status
    runner = AgentRunner(
        chat_memory_provider=InMemoryChatMemoryProvider(),
        policy=AgentExecutionPolicy(retry=RetryPolicy(jitter=0)),
        clock=FakeClock(),
    )
    active = _turn_in_status(status, runner)
    # When: another turn is started in the same conversation
    with pytest.raises(AgentConversationBusyException) as caught:
        runner.run(runner.agent_for(active), "second", conversation_id="c")
    # Then: the error names the conversation, the active turn and its status
    assert (caught.value.conversation_id, caught.value.active_turn_id) == ("c", active.id)
    assert caught.value.status == status
    # When: the active turn ends
    runner.cancel(active.id)
    ended = runner.turn_store.load(active.id)
    if not ended.is_terminal:  # a RUNNING turn is ended by the thread that steps it
        ended = runner.run_until_blocked(ended)
    assert ended.status is S.CANCELLED
    # Then: the conversation is free again
    assert runner.turn_store.find_active_turn("c") is None
    assert runner.run(runner.agent_for(active), "second", conversation_id="c").status is S.COMPLETED


def test_turns_in_different_conversations_do_not_block_each_other() -> None:
    runner = AgentRunner(chat_memory_provider=InMemoryChatMemoryProvider())
    agent = Agent(id="racer", chat_model=_approval_model(), tools=[publish])
    first = runner.run(agent, "a", conversation_id="c-1")
    second = runner.run(agent, "b", conversation_id="c-2")
    assert first.status is second.status is S.WAITING_FOR_APPROVAL


# --- Page messages ----------------------------------------------------------------------------


class SlowReadStore(InMemoryAgentTurnStore):
    """A turn store whose reads can be slowed down, so that concurrent writers read the same version."""

    def __init__(self) -> None:
        super().__init__()
        self.read_delay = 0.0

    def load(self, turn_id: str) -> AgentTurn:
        turn = super().load(turn_id)
        if self.read_delay:
            time.sleep(self.read_delay)
        return turn


def _approval_in_conversation(
    *, tools: Sequence[object] = (), call: ToolCall | None = None, store: InMemoryAgentTurnStore | None = None
) -> tuple[AgentRunner, InMemoryChatMemory, AgentTurn, ScriptedChatModel]:
    provider = InMemoryChatMemoryProvider()
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[call or ToolCall(id="p1", name="publish", arguments={"text": "hello"})]),
            AiMessage(content="done"),
        ]
    )
    agent = Agent(id="pub", chat_model=model, tools=list(tools or [publish]))  # type: ignore[arg-type]
    runner = AgentRunner(turn_store=store, chat_memory_provider=provider)
    turn = runner.run(agent, "publish hello", conversation_id="c-1")
    return runner, provider("c-1"), turn, model


def test_a_pending_approval_shows_an_action_message_offering_approve_and_reject() -> None:
    runner, memory, turn, _ = _approval_in_conversation()
    [action] = _page_messages(memory)
    assert isinstance(action, AgentActionMessage)
    assert (action.turn_id, action.action_id, action.tool_name) == (turn.id, "p1", "publish")
    assert action.status is ActionStatus.PENDING
    assert action.get_actions() == ["APPROVE", "REJECT"]
    assert "hello" in action.summary
    assert not action.model_visible


@pytest.mark.parametrize(
    ("command", "status"),
    [
        (AgentResumeCommand.approve_tool("p1"), ActionStatus.APPROVED),
        (AgentResumeCommand.reject_tool("p1", "no"), ActionStatus.REJECTED),
    ],
)
def test_a_decision_updates_the_same_action_message_with_version_plus_one_and_appends_no_page_message(
    command: AgentResumeCommand, status: ActionStatus
) -> None:
    # Given: the pending action message
    runner, memory, turn, _ = _approval_in_conversation()
    [before] = _page_messages(memory)
    count_before = len(memory.get_messages(100))
    # When: the decision is submitted
    runner.submit_resume(turn.id, command)
    # Then: the same message changed status, offers nothing, and its version went up by one
    [after] = _page_messages(memory)
    assert after.id == before.id
    assert after.status is status and after.get_actions() == []
    assert after.version == before.version + 1
    # And only model messages the decision itself wrote were appended (a ToolMessage for a rejection)
    new = memory.get_messages(100)[count_before:]
    assert all(m.model_visible for m in new)
    assert len(new) == (1 if status is ActionStatus.REJECTED else 0)


def test_a_decision_keeps_its_page_message_when_the_turn_goes_on() -> None:
    runner, memory, turn, _ = _approval_in_conversation()
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("p1"))
    assert turn.status is S.COMPLETED
    [action] = _page_messages(memory)
    assert action.status is ActionStatus.APPROVED
    assert [m.role for m in memory.get_messages(100)] == ["user", "assistant", "agent_action", "tool", "assistant"]


def test_a_form_shows_a_form_message_with_key_full_schema_and_submit_then_submitted() -> None:
    # Given: the support scenario in a conversation, waiting for the form
    provider = InMemoryChatMemoryProvider()
    sc = ticket_scenario(provider)
    turn = sc.runner.run(sc.agent, "open an incident ticket", conversation_id="c-1")
    memory = provider("c-1")
    [form] = _page_messages(memory)
    # Then: the form message carries key, full schema and the call it stands for, and offers SUBMIT
    assert isinstance(form, AgentFormMessage)
    assert (form.form_key, form.action_id, form.turn_id) == (TICKET_FORM.key, "c1", turn.id)
    assert form.schema == TICKET_SCHEMA
    assert form.status is ActionStatus.PENDING and form.get_actions() == ["SUBMIT"]
    # When: the data is submitted
    sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    # Then: the same message is SUBMITTED, one version later
    updated = memory.get(form.id)
    assert isinstance(updated, AgentFormMessage)
    assert updated.status is ActionStatus.SUBMITTED and updated.get_actions() == []
    assert updated.version == form.version + 1
    assert sum(isinstance(m, AgentFormMessage) for m in memory.get_messages(100)) == 1


def test_sensitive_arguments_never_appear_in_the_page_message() -> None:
    # Given: an approval tool with a sensitive argument
    @tool(requires_approval=True, sensitive=["password"])
    def reset_password(user: str, password: str) -> str:
        """Reset a password."""
        return "reset"

    secret = "hunter2-very-secret"
    runner, memory, turn, _ = _approval_in_conversation(
        tools=[reset_password],
        call=ToolCall(id="r1", name="reset_password", arguments={"user": "ann", "password": secret}),
    )
    # Then: the card names the user but never the password, before and after the decision
    [card] = _page_messages(memory)
    assert "ann" in card.model_dump_json()
    assert secret not in card.model_dump_json()
    runner.resume(turn.id, AgentResumeCommand.approve_tool("r1"))
    [card] = _page_messages(memory)
    assert secret not in card.model_dump_json()


def test_page_messages_are_never_sent_to_the_model() -> None:
    # Given: a conversation with a form message and an action message, then a second turn
    provider = InMemoryChatMemoryProvider()
    sc = ticket_scenario(provider)
    turn = sc.runner.run(sc.agent, "open an incident ticket", conversation_id="c-1")
    turn = sc.runner.resume(turn.id, AgentResumeCommand.user_input("c1", VALID_TICKET))
    sc.runner.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    page_ids = {m.id for m in _page_messages(provider("c-1"))}
    assert len(page_ids) == 2
    follow_up = ScriptedChatModel([AiMessage(content="anything else?")])
    AgentRunner(chat_memory_provider=provider).run(
        Agent(id="next", chat_model=follow_up), "thanks", conversation_id="c-1"
    )
    # Then: no request ever carried a page message
    requests: list[ChatRequest] = [*sc.model.requests, *follow_up.requests]
    assert len(requests) == 4
    for request in requests:
        assert {m.role for m in request.messages} <= MODEL_ROLES
        assert not page_ids & {m.id for m in request.messages}


def test_updating_a_page_message_with_a_stale_version_raises_and_changes_nothing() -> None:
    runner, memory, turn, _ = _approval_in_conversation()
    [card] = _page_messages(memory)
    memory.update(card.model_copy(update={"summary": "edited"}), card.version)
    with pytest.raises(VersionConflictError):
        memory.update(card.model_copy(update={"status": ActionStatus.APPROVED}), card.version)
    [stored] = _page_messages(memory)
    assert isinstance(stored, AgentActionMessage)
    assert (stored.status, stored.summary, stored.version) == (ActionStatus.PENDING, "edited", card.version + 1)


def _race_decisions(runner: AgentRunner, turn_id: str, commands: dict[str, AgentResumeCommand]) -> dict[str, str]:
    """Send the commands from one thread each at the same moment; report which were applied or refused."""
    barrier = threading.Barrier(len(commands))
    outcomes: dict[str, str] = {}

    def decide(name: str) -> None:
        barrier.wait()
        try:
            runner.resume(turn_id, commands[name])
        except InvalidResumeCommand:
            outcomes[name] = "refused"
        else:
            outcomes[name] = "applied"

    threads = [threading.Thread(target=decide, args=(name,)) for name in commands]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_concurrent_approve_and_reject_of_one_action_let_exactly_one_win() -> None:
    for _ in range(5):
        # Given: a pending approval, on a store slow enough that both deciders read the same version
        store = SlowReadStore()
        runner, memory, turn, _ = _approval_in_conversation(store=store)
        store.read_delay = 0.01
        # When: approve and reject arrive at the same time from two threads
        outcomes = _race_decisions(
            runner,
            turn.id,
            {"approve": AgentResumeCommand.approve_tool("p1"), "reject": AgentResumeCommand.reject_tool("p1")},
        )
        store.read_delay = 0.0
        # Then: exactly one was applied, the other refused, and the card shows the winner
        assert sorted(outcomes.values()) == ["applied", "refused"]
        winner = next(name for name, outcome in outcomes.items() if outcome == "applied")
        [card] = _page_messages(memory)
        assert card.status is (ActionStatus.APPROVED if winner == "approve" else ActionStatus.REJECTED)
        final = runner.turn_store.load(turn.id)
        assert final.status is S.COMPLETED
        answers = [m for m in final.messages if isinstance(m, ToolMessage)]
        assert len(answers) == 1 and answers[0].is_error is (winner == "reject")


# --- Projection failures ----------------------------------------------------------------------


class UnreliableMemory:
    """A ChatMemory over an in-memory one that can be down, or crash once right after writing."""

    def __init__(self, inner: InMemoryChatMemory) -> None:
        self.inner = inner
        self.conversation_id = inner.conversation_id
        self.down = False
        self.crash_after_next_write = False
        self.fail_next_append = False

    def get_messages(self, count: int) -> list[AnyMessage]:
        return self.inner.get_messages(count)

    def get_model_messages(self, count: int) -> list[ModelMessage]:
        return self.inner.get_model_messages(count)

    def get(self, message_id: str) -> AnyMessage | None:
        return self.inner.get(message_id)

    def append(self, messages: Sequence[AnyMessage]) -> None:
        if self.down:
            raise StoreUnavailableError("chat memory is down")
        if self.fail_next_append:
            self.fail_next_append = False
            raise StoreUnavailableError("chat memory dropped the connection")
        self.inner.append(messages)
        if self.crash_after_next_write:
            self.crash_after_next_write = False
            raise StoreUnavailableError("connection lost after the write")

    def update(self, message: AnyMessage, expected_version: int) -> AnyMessage:
        if self.down:
            raise StoreUnavailableError("chat memory is down")
        return self.inner.update(message, expected_version)


def _unreliable_runner() -> tuple[AgentRunner, UnreliableMemory, EventLog, Callable[[], AgentRunner]]:
    memory = UnreliableMemory(InMemoryChatMemory("c-1"))
    store = InMemoryAgentTurnStore()
    loader = InMemoryAgentLoader()

    def provider(conversation_id: str) -> UnreliableMemory:
        assert conversation_id == "c-1"
        return memory

    def make() -> AgentRunner:
        return AgentRunner(turn_store=store, agent_loader=loader, chat_memory_provider=provider)

    runner = make()
    events = EventLog()
    runner.add_event_listener(events)
    return runner, memory, events, make


def _assert_memory_mirrors(memory: UnreliableMemory, turn: AgentTurn) -> None:
    ids = _model_ids(memory.inner)
    assert ids == [m.id for m in turn.messages if not isinstance(m, SystemMessage)]
    everything = [m.id for m in memory.get_messages(10_000)]
    assert len(everything) == len(set(everything))


def test_a_memory_failure_on_append_never_fails_the_turn_and_restore_reprojects_without_duplicates() -> None:
    # Given: a memory that fails one append at the last save of the turn
    runner, memory, events, _ = _unreliable_runner()
    agent = Agent(
        id="pub",
        chat_model=ScriptedChatModel(
            [
                AiMessage(tool_calls=[ToolCall(id="p1", name="publish", arguments={"text": "x"})]),
                AiMessage(content="done"),
            ]
        ),
        tools=[publish],
    )
    turn = runner.run(agent, "go", conversation_id="c-1")
    memory.fail_next_append = True
    # When: the turn finishes
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("p1"))
    # Then: the turn saved fine and a CHAT_MEMORY_ERROR event was emitted
    assert turn.status is S.COMPLETED
    assert runner.turn_store.load(turn.id).status is S.COMPLETED
    assert len(events.of_type(AgentEventType.CHAT_MEMORY_ERROR)) == 1
    # When: the turn is restored (twice)
    runner.restore(turn.id)
    runner.restore(turn.id)
    # Then: memory mirrors the turn exactly once, and the card shows the decision
    _assert_memory_mirrors(memory, turn)
    [card] = _page_messages(memory.inner)
    assert card.status is ActionStatus.APPROVED


def test_a_memory_that_was_down_for_the_whole_turn_is_filled_by_restore_from_another_runner() -> None:
    runner, memory, events, make = _unreliable_runner()
    agent = Agent(
        id="pub",
        chat_model=ScriptedChatModel(
            [
                AiMessage(tool_calls=[ToolCall(id="p1", name="publish", arguments={"text": "x"})]),
                AiMessage(content="done"),
            ]
        ),
        tools=[publish],
    )
    memory.down = True
    turn = runner.run(agent, "go", conversation_id="c-1")
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("p1"))
    assert turn.status is S.COMPLETED
    assert memory.get_messages(100) == []
    assert events.of_type(AgentEventType.CHAT_MEMORY_ERROR)
    memory.down = False
    make().restore(turn.id)
    _assert_memory_mirrors(memory, turn)
    [card] = _page_messages(memory.inner)
    assert card.status is ActionStatus.APPROVED


def test_a_crash_right_after_a_memory_write_never_duplicates_messages() -> None:
    # Given: writes that reach memory but are reported as failed, at two points of the turn
    runner, memory, _, _ = _unreliable_runner()
    agent = Agent(
        id="pub",
        chat_model=ScriptedChatModel(
            [
                AiMessage(tool_calls=[ToolCall(id="p1", name="publish", arguments={"text": "x"})]),
                AiMessage(content="done"),
            ]
        ),
        tools=[publish],
    )
    memory.crash_after_next_write = True
    turn = runner.run(agent, "go", conversation_id="c-1")
    memory.crash_after_next_write = True
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("p1"))
    # When: the projection is redone
    runner.restore(turn.id)
    # Then: every message is there once, in order
    _assert_memory_mirrors(memory, turn)
    assert Counter(m.role for m in memory.get_messages(100))["agent_action"] == 1


def test_close_out_reaches_memory_so_the_next_turn_sends_a_protocol_valid_history() -> None:
    # Given: a conversation turn waiting for approval, then cancelled
    provider = InMemoryChatMemoryProvider()
    runner = AgentRunner(chat_memory_provider=provider)
    first = runner.run(Agent(id="pub", chat_model=_approval_model(), tools=[publish]), "publish x", conversation_id="c")
    runner.cancel(first.id)
    # When: the next turn of the conversation runs
    model = ScriptedChatModel([AiMessage(content="ok")])
    runner.run(Agent(id="next", instructions="Be brief.", chat_model=model), "try again", conversation_id="c")
    # Then: its request is assistant tool call -> tool answer -> closing assistant -> new user
    sent = model.requests[0].messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert protocol_violations(sent) == []
    # And the card of the cancelled call no longer offers actions
    [card] = _page_messages(provider("c"))
    assert card.get_actions() == []
