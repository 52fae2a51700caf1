"""An ended turn whose last ChatMemory write failed is projected before the conversation's next turn reads it."""

from __future__ import annotations

from collections.abc import Sequence

from agent_runner import (
    Agent,
    AgentRunner,
    AiMessage,
    AnyMessage,
    InMemoryChatMemory,
    ScriptedChatModel,
)


class FlakyMemory(InMemoryChatMemory):
    fail_next_append = False

    def append(self, messages: Sequence[AnyMessage]) -> None:
        if FlakyMemory.fail_next_append:
            FlakyMemory.fail_next_append = False
            raise ConnectionError("chat memory briefly unreachable")
        super().append(messages)


def test_the_next_turn_sees_the_final_answer_of_a_turn_whose_projection_failed() -> None:
    memories: dict[str, FlakyMemory] = {}

    def provider(conversation_id: str) -> FlakyMemory:
        return memories.setdefault(conversation_id, FlakyMemory(conversation_id))

    model = ScriptedChatModel([AiMessage(content="first answer"), AiMessage(content="second answer")])
    agent = Agent(id="a", chat_model=model)
    runner = AgentRunner(chat_memory_provider=provider)
    turn = runner.start(agent, "first question", conversation_id="c")
    FlakyMemory.fail_next_append = True
    assert runner.run_until_blocked(turn).status == "COMPLETED"
    assert [m.content for m in provider("c").get_messages(10)] == ["first question"]  # type: ignore[union-attr]

    second = runner.run(agent, "second question", conversation_id="c")

    contents = [m.content for m in second.messages]
    assert contents == ["first question", "first answer", "second question", "second answer"]
    shown = [m.content for m in provider("c").get_messages(10)]  # type: ignore[union-attr]
    assert shown == ["first question", "first answer", "second question", "second answer"]
