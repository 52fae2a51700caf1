"""A store that writes the ChatMemory projection in its saves is used for it only when it says it can."""

from __future__ import annotations

from collections.abc import Sequence

from agent_runner import (
    Agent,
    AgentRunner,
    AiMessage,
    AnyMessage,
    ChatMemoryProvider,
    InMemoryAgentTurnStore,
    InMemoryChatMemory,
    ScriptedChatModel,
)
from agent_runner.events import AgentEvent
from agent_runner.persistence import ProjectingTurnStore
from agent_runner.snapshot import AgentTurn


class ProjectingStore(InMemoryAgentTurnStore):
    """Projects in its saves into the memories of one provider, as a SQL store does for its own database."""

    def __init__(self, provider: ChatMemoryProvider) -> None:
        super().__init__()
        self.provider = provider
        self.projected_saves = 0
        self.appends = 0

    def projects_into(self, provider: ChatMemoryProvider) -> bool:
        return provider is self.provider

    def save_projected(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        assert turn.conversation_id is not None
        new = turn.messages[turn.projected_count :]
        if new:
            self.provider(turn.conversation_id).append(new)
            self.appends += 1
        marked = turn.model_copy(update={"projected_count": len(turn.messages)})
        self.projected_saves += 1
        return self.save(marked, expected_version, events)


class CountingMemory(InMemoryChatMemory):
    appends = 0

    def append(self, messages: Sequence[AnyMessage]) -> None:
        CountingMemory.appends += 1
        super().append(messages)


def _run(store: ProjectingStore, provider: ChatMemoryProvider) -> AgentTurn:
    agent = Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hello")]))
    return AgentRunner(turn_store=store, chat_memory_provider=provider).run(agent, "hi", conversation_id="c")


def test_the_runner_leaves_the_projection_to_a_store_that_writes_into_its_chat_memory() -> None:
    memories: dict[str, CountingMemory] = {}

    def provider(conversation_id: str) -> CountingMemory:
        return memories.setdefault(conversation_id, CountingMemory(conversation_id))

    store = ProjectingStore(provider)
    assert isinstance(store, ProjectingTurnStore)
    CountingMemory.appends = 0
    turn = _run(store, provider)
    saves = turn.version + 1
    assert store.projected_saves == saves
    # Only the store appended, never the runner besides it
    assert CountingMemory.appends == store.appends > 0
    assert [m.id for m in provider("c").get_messages(10)] == [m.id for m in turn.messages]


def test_the_runner_projects_itself_when_the_store_cannot_write_into_its_chat_memory() -> None:
    memories: dict[str, InMemoryChatMemory] = {}

    def provider(conversation_id: str) -> InMemoryChatMemory:
        return memories.setdefault(conversation_id, InMemoryChatMemory(conversation_id))

    store = ProjectingStore(lambda conversation_id: InMemoryChatMemory(conversation_id))
    turn = _run(store, provider)
    assert store.projected_saves == 0
    assert [m.id for m in provider("c").get_messages(10)] == [m.id for m in turn.messages]
