"""Text that is hard to store comes back exactly: Unicode, emoji, control characters, 1 MB messages."""

from __future__ import annotations

import pytest

from agent_runner import (
    AgentActionMessage,
    AgentTurn,
    AiMessage,
    ModelMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runner.persistence import ConversationKey
from store import Inbox, SqlAgentTurnStore, SqlChatMemoryProvider
from tests.integration.store.conftest import ZONED_SQL_DATABASES

# Every control character but NUL (which PostgreSQL text cannot hold), lone-looking
# combining marks, right-to-left and zero-width characters, the BOM, non-characters,
# characters outside the Basic Multilingual Plane, and JSON/SQL metacharacters.
AWKWARD = (
    "".join(chr(code) for code in range(1, 32))
    + "\x7f\x80\x9f"
    + "e\u0301 a\u0308\u0323 "
    + "\u202eRTL\u202c \u200b\u200d\u2028\u2029\ufeff\ufffe\uffff"
    + "👩🏽‍🚀🏳️‍🌈🇯🇵 \U0001f600 \U0010fffd 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 日本語 Ελληνικά עברית العربية"
    + " \\ \\\\ \" ' `; -- /* */ $$ %s %(x)s {} [] \\u0000 \\n"
)

# Timestamps written and read back must not depend on the session time zone.
pytestmark = pytest.mark.parametrize("sql_url", ZONED_SQL_DATABASES, indirect=True)
MEGABYTE = ("0123456789abcdef" * 65_536)[:1_000_000] + "✓"
EMOJI_MEGABYTE = "🦀" * 262_144  # 1 MiB of UTF-8


def awkward_messages() -> list[ModelMessage]:
    call = ToolCall(
        id="call-" + AWKWARD[:8], name="tool_" + "ü", arguments={AWKWARD: [AWKWARD, {"k": AWKWARD}], "n": 1.5e-300}
    )
    return [
        UserMessage(id="u-" + AWKWARD[40:60], content=AWKWARD),
        AiMessage(id="a-1", content=AWKWARD, tool_calls=[call]),
        ToolMessage(id="t-1", tool_call_id=call.id, tool_name=call.name, content=MEGABYTE),
        UserMessage(id="u-2", content=EMOJI_MEGABYTE),
    ]


@pytest.mark.parametrize("split", [False, True], ids=["created-at-once", "appended-later"])
def test_awkward_and_large_turn_messages_round_trip_exactly(sql_url: str, split: bool) -> None:
    messages = awkward_messages()
    turn = AgentTurn(
        id="t-" + AWKWARD[50:58],
        agent_id="a",
        root_turn_id="root",
        messages=messages[:1] if split else messages,
        error=AWKWARD,
        final_output=MEGABYTE,
        form_data={"call": {AWKWARD: AWKWARD}},
    )
    with SqlAgentTurnStore(sql_url) as turns:
        saved = turns.save(turn, -1)
        if split:
            saved = turns.save(turn.model_copy(update={"messages": messages}), 0)
        loaded = turns.load(turn.id)
    assert loaded == saved
    assert loaded.messages == messages
    assert loaded.model_dump_json() == saved.model_dump_json()
    assert loaded.messages[2].content == MEGABYTE


def test_awkward_and_large_chat_messages_round_trip_exactly(sql_url: str) -> None:
    card = AgentActionMessage(
        id="card-" + AWKWARD[60:70],
        turn_id="t",
        action_id="c",
        tool_name="x",
        summary=AWKWARD,
        arguments={"a": AWKWARD},
    )
    messages = [*awkward_messages(), card]
    with SqlChatMemoryProvider(sql_url) as provider:
        memory = provider(AWKWARD[10:40])
        memory.append(messages)
        assert memory.get_messages(10) == messages
        assert memory.get(card.id) == card
        updated = memory.update(card.model_copy(update={"summary": EMOJI_MEGABYTE}), 0)
        assert memory.get(card.id) == updated


def test_awkward_and_large_inbox_content_round_trips_exactly(sql_url: str) -> None:
    with Inbox(sql_url) as inbox:
        queued = inbox.enqueue(AWKWARD, "m-" + AWKWARD[:20], AWKWARD + MEGABYTE)
        claimed = inbox.claim_next(ConversationKey(AWKWARD))
    assert claimed is not None
    assert claimed.content == queued.content == AWKWARD + MEGABYTE
    assert (claimed.message_id, claimed.conversation_id) == ("m-" + AWKWARD[:20], AWKWARD)
