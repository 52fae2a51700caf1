"""A conversation turn's ChatMemory projection written by the save's own statement on PostgreSQL."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

import store
from agent_runner import (
    ActionStatus,
    Agent,
    AgentActionMessage,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentLoader,
    InMemoryChatMemoryProvider,
    ScriptedChatModel,
    SystemMessage,
    ToolCall,
    UserMessage,
    VersionConflictError,
    tool,
)
from agent_runner._runtime.projection import Projection
from agent_runner.snapshot import AgentTurn, PageAction
from store.turns import postgres
from tests.integration.store.store_kit import recording

pytestmark = pytest.mark.integration


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def _agent() -> Agent:
    calls = [
        AiMessage(tool_calls=[ToolCall(id=f"call-{i}", name="lookup", arguments={"order": str(i)})]) for i in range(3)
    ]
    return Agent(id="orders", chat_model=ScriptedChatModel([*calls, AiMessage(content="all shipped")]), tools=[lookup])


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(pg_url)
    try:
        yield engine
    finally:
        engine.dispose()


def test_each_step_of_a_conversation_turn_is_one_statement_that_projects_it(engine: sa.Engine) -> None:
    turns = store.SqlAgentTurnStore(engine)
    provider = store.SqlChatMemoryProvider(engine)
    runner = AgentRunner(turn_store=turns, chat_memory_provider=provider)
    turn = runner.start(_agent(), "where are my orders?", conversation_id="c-1")
    with recording(engine) as recorded:
        done = runner.run_until_blocked(turn)
    assert done.status is AgentTurnStatus.COMPLETED
    saves = done.version - turn.version
    # One autocommitted statement per save: snapshot, events and ChatMemory together; the
    # only other statements are the reads of steering messages, one before each model call,
    # one after the final answer and one once the turn has ended
    model_calls = done.model_iterations
    assert recorded.statements.count("WITH") == saves and recorded.commits == 0
    assert sorted(set(recorded.statements)) == ["SELECT", "WITH"]
    assert recorded.statements.count("SELECT") == model_calls + 2
    assert turns.projection_fallbacks == 0
    projected = [m.id for m in done.messages if not isinstance(m, SystemMessage)]
    assert [m.id for m in provider("c-1").get_messages(100)] == projected
    assert turns.load(done.id).projected_count == len(done.messages)
    # The next turn of the conversation reads the whole history
    follow_up = runner.run(
        Agent(id="echo", chat_model=ScriptedChatModel([AiMessage(content="ok")])), "thanks", conversation_id="c-1"
    )
    assert [m.id for m in follow_up.messages[: len(projected)]] == projected


def test_a_save_that_projects_messages_already_in_chat_memory_writes_none_twice(engine: sa.Engine) -> None:
    turns = store.SqlAgentTurnStore(engine)
    memory = store.SqlChatMemoryProvider(engine)("c-1")
    first = UserMessage(id="m-1", content="hello")
    created = turns.save(
        AgentTurn(id="t-1", agent_id="a", root_turn_id="t-1", conversation_id="c-1", messages=[first]), -1
    )
    # A projection that wrote part of what the next save carries, then crashed before its marks were saved
    answer, question = AiMessage(id="m-2", content="hi"), UserMessage(id="m-3", content="how are you?")
    memory.append([first, answer])
    saved = turns.save_projected(created.model_copy(update={"messages": [first, answer, question]}), created.version)
    assert saved.projected_count == 3 and turns.projection_fallbacks == 0
    assert [m.id for m in memory.get_messages(10)] == ["m-1", "m-2", "m-3"]
    # Saving the same snapshot again is refused by the compare-and-swap, and projects nothing
    with pytest.raises(VersionConflictError):
        turns.save_projected(created.model_copy(update={"messages": [first, answer, question]}), created.version)
    assert [m.id for m in memory.get_messages(10)] == ["m-1", "m-2", "m-3"]
    assert turns.load("t-1").projected_count == 3


def test_a_save_that_cannot_carry_the_projection_is_counted_and_the_runner_projects_it(engine: sa.Engine) -> None:
    provider = store.SqlChatMemoryProvider(engine)
    agent = _agent()
    turn = AgentRunner(turn_store=store.SqlAgentTurnStore(engine), chat_memory_provider=provider).start(
        agent, "where are my orders?", conversation_id="c-1"
    )
    # A store that has not seen the turn saves it in a transaction, without the projection
    other = store.SqlAgentTurnStore(engine)
    runner = AgentRunner(turn_store=other, chat_memory_provider=provider, agent_loader=InMemoryAgentLoader([agent]))
    stepped = runner.step(turn).turn
    assert other.projection_fallbacks == 1
    visible = [m.id for m in stepped.messages if not isinstance(m, SystemMessage)]
    assert [m.id for m in provider("c-1").get_messages(100)] == visible
    # Once the store knows the turn, its saves carry the projection again
    done = runner.run_until_blocked(stepped)
    assert done.status is AgentTurnStatus.COMPLETED and other.projection_fallbacks == 1
    visible = [m.id for m in done.messages if not isinstance(m, SystemMessage)]
    assert [m.id for m in provider("c-1").get_messages(100)] == visible


def test_only_a_chat_memory_of_the_same_postgresql_database_is_projected_in_the_save(
    engine: sa.Engine, pg_url: str, sqlite_url: str
) -> None:
    turns = store.SqlAgentTurnStore(engine)
    assert turns.projects_into(store.SqlChatMemoryProvider(engine))
    with store.SqlChatMemoryProvider(pg_url) as same_database:
        assert turns.projects_into(same_database)
    with store.SqlChatMemoryProvider(sqlite_url) as other_database:
        assert not turns.projects_into(other_database)
    assert not turns.projects_into(InMemoryChatMemoryProvider())
    with store.SqlAgentTurnStore(sqlite_url) as embedded, store.SqlChatMemoryProvider(sqlite_url) as chat:
        assert not embedded.projects_into(chat)


def test_every_kind_of_save_statement_is_short_enough_for_the_drivers_cache() -> None:
    for template in (postgres._SAVE, postgres._CREATE):
        for child, conversations, chat in itertools.product((False, True), repeat=3):
            if child and chat:
                continue  # never made: a child turn has no conversation of its own, so its saves project nothing
            assert len(postgres._statement(template, child, conversations, chat)) <= MAX_CACHED_STATEMENT_LENGTH


def _card_turn(turns: store.SqlAgentTurnStore) -> AgentTurn:
    """A conversation turn saved with the approval card it shows, PENDING, in ChatMemory (by the save)."""
    card = AgentActionMessage(id="card-1", turn_id="t-1", action_id="call-1", tool_name="refund", summary="refund(1)")
    action = PageAction(
        message_id="card-1", action_id="call-1", kind="approval", payload=card.model_dump(mode="json", by_alias=True)
    )
    turn = AgentTurn(
        id="t-1",
        agent_id="a",
        root_turn_id="t-1",
        conversation_id="c-1",
        messages=[UserMessage(id="u-1", content="refund order 1")],
        page_actions=[action],
    )
    created = turns.save_projected(turn, -1)
    shown = turns.save_projected(created, created.version)
    assert shown.page_actions[0].synced
    return shown


def _decided(turn: AgentTurn, status: ActionStatus) -> AgentTurn:
    action = turn.page_actions[0].model_copy(
        update={"status": status, "synced": False, "decision": {"decided_by": "ana", "reason": "ok"}}
    )
    return turn.model_copy(update={"page_actions": [action]})


def test_a_page_action_s_new_state_is_in_chat_memory_when_its_save_returns(engine: sa.Engine) -> None:
    turns = store.SqlAgentTurnStore(engine)
    memory = store.SqlChatMemoryProvider(engine)("c-1")
    turn = _card_turn(turns)
    card = memory.get("card-1")
    assert isinstance(card, AgentActionMessage) and (card.status, card.version) == (ActionStatus.PENDING, 0)
    # When the approval's decision is saved
    with recording(engine) as recorded:
        saved = turns.save_projected(_decided(turn, ActionStatus.APPROVED), turn.version)
    # Then the card shows it as the save returns: one read of the card, and the save's own statement
    assert (recorded.statements, recorded.commits) == (["SELECT", "WITH"], 0)
    card = memory.get("card-1")
    assert isinstance(card, AgentActionMessage)
    assert (card.status, card.decided_by, card.reason, card.version) == (ActionStatus.APPROVED, "ana", "ok", 1)
    # And the snapshot says so, so the runner writes nothing more; the next save stores the mark
    assert saved.page_actions[0].synced and not turns.load("t-1").page_actions[0].synced
    again = turns.save_projected(saved, saved.version)
    assert turns.load("t-1").page_actions[0].synced and again.page_actions[0].synced
    assert [m.id for m in memory.get_messages(10)] == ["u-1", "card-1"]


def test_a_page_message_edited_after_the_save_read_it_is_not_overwritten_but_reconciled(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = store.SqlAgentTurnStore(engine)
    provider = store.SqlChatMemoryProvider(engine)
    memory = provider("c-1")
    turn = _card_turn(turns)
    read_page_messages = postgres.page_writes

    def edited_meanwhile(unsynced: Any, stored: Any) -> Any:
        # Another writer changes the card between the save's read and its statement
        card = memory.get("card-1")
        assert isinstance(card, AgentActionMessage)
        memory.update(card.model_copy(update={"summary": "refund(1) of 20 EUR"}), card.version)
        return read_page_messages(unsynced, stored)

    monkeypatch.setattr(postgres, "page_writes", edited_meanwhile)
    saved = turns.save_projected(_decided(turn, ActionStatus.REJECTED), turn.version)
    monkeypatch.undo()
    # The save went through, its compare-and-swap on the card did not: the edit stays, the action unsynced
    assert saved.version == turn.version + 1 and not saved.page_actions[0].synced
    card = memory.get("card-1")
    assert isinstance(card, AgentActionMessage)
    assert (card.summary, card.status, card.version) == ("refund(1) of 20 EUR", ActionStatus.PENDING, 1)
    # And the runner's reconciliation applies the decision over the edited card
    reconciled = Projection(provider, lambda turn, error: pytest.fail(error)).project(saved)
    card = memory.get("card-1")
    assert isinstance(card, AgentActionMessage)
    assert (card.summary, card.status, card.decided_by, card.version) == (
        "refund(1) of 20 EUR",
        ActionStatus.REJECTED,
        "ana",
        2,
    )
    assert reconciled.page_actions[0].synced
