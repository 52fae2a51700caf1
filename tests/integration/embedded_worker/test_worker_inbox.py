"""Queued messages without a server: `agent-runner worker` starts a conversation's next message when its turn ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_runner import AgentRunner, AgentTurn, AgentTurnStatus
from store import Inbox, InboxMessage, InboxStatus, SqlAgentTurnStore, SqlChatMemoryProvider
from tests.integration.embedded_worker.embedded_fleet import loader, spawn_command_worker, wait_for
from workers.inbox import enqueue_message

pytestmark = pytest.mark.integration


def test_the_worker_command_starts_a_queued_message_when_the_conversation_frees(
    sqlite_url: str, tmp_path: Path
) -> None:
    with SqlAgentTurnStore(sqlite_url) as turns, Inbox(sqlite_url) as inbox:
        # Given a conversation with an active turn (a few slow tool calls), and a message queued behind it
        runner = AgentRunner(
            turn_store=turns, agent_loader=loader(), chat_memory_provider=SqlChatMemoryProvider(turns.engine)
        )
        first = runner.start("pauser", "go slowly", conversation_id="conv-queue")
        queued = enqueue_message(
            runner, "conv-queue", "and then this", message_id="msg-next", agent_id="looper", inbox=inbox
        )
        assert queued.status is InboxStatus.PENDING  # the conversation is busy: nothing started

        # When `agent-runner worker` runs, and no server does
        def started() -> InboxMessage | None:
            message = inbox.get("msg-next")
            return message if message is not None and message.status is InboxStatus.COMPLETED else None

        def ended(turn_id: str) -> AgentTurn | None:
            turn = turns.load(turn_id)
            return turn if turn.is_terminal else None

        worker = spawn_command_worker(tmp_path, "inbox", sqlite_url)
        try:
            worker.wait_ready()
            message = wait_for(started, 30, "the queued message to start its turn")
            assert message.turn_id is not None
            second = wait_for(lambda: ended(str(message.turn_id)), 30, "the queued turn to end")
        finally:
            code = worker.stop()
        first_ended = turns.load(first.id)
        in_conversation = {t.id for t in turns.list_turns(conversation_id="conv-queue")}

    # Then the message started its turn once the first ended, in the same conversation, and the worker ran it
    assert first_ended.status is AgentTurnStatus.COMPLETED
    assert second.status is AgentTurnStatus.COMPLETED and second.final_output == "finished after 2 tool calls"
    assert second.conversation_id == "conv-queue" and second.created_at > first.created_at
    assert any(m.id == "msg-next" and m.content == "and then this" for m in second.messages)
    assert in_conversation == {first.id, second.id}
    assert code == 0, worker.log()
