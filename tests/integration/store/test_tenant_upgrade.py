"""Upgrading to 0011 from a database written by earlier versions, which stored a tenant's conversation as `<tenant>/<id>`.

The database is built at revision 0009 and filled with rows as those versions wrote them:
three conversations named `c-1` (tenant `acme`'s, tenant `globex`'s and one without a
tenant), with turns, a child turn, events and their cursors, ChatMemory, a queued message,
a thread and a cron. After the upgrade the new code reads them under (tenant, `c-1`),
clients keep their cursors, and the conversations go on where they were.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import store
from agent_runner import (
    Agent,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ConversationKey,
    EventScope,
    InMemoryAgentLoader,
    ScriptedChatModel,
    UserMessage,
)
from agent_runner.ids import utcnow
from store.turns.columns import HEADER
from tests.integration.store.migration_kit import migrated_to, schema_differences
from workers.api import create_app

DATABASES = pytest.mark.parametrize(
    "database",
    [
        pytest.param("sqlite_url", id="sqlite"),
        pytest.param("empty_pg_url", id="postgres", marks=pytest.mark.integration),
    ],
)

NOW = utcnow() - timedelta(minutes=5)
ACME = "acme/c-1"  # how earlier versions stored tenant acme's conversation c-1


def _earlier_queued_turn_id(stored_conversation: str, message_id: str) -> str:
    """The turn id earlier versions derived for a queued message, from the stored conversation id."""
    return hashlib.sha256(f"queued-message\x00{stored_conversation}\x00{message_id}".encode()).hexdigest()[:32]


QUEUED_TURN = _earlier_queued_turn_id(ACME, "m-queued")


def _earlier_turn(
    turn_id: str,
    conversation: str | None,
    tenant: str | None,
    status: AgentTurnStatus,
    *,
    root: str | None = None,
    root_conversation: str | None = None,
    **fields: Any,
) -> AgentTurn:
    """A turn as earlier versions kept it: `conversation` and `root_conversation` are stored ids."""
    return AgentTurn.model_validate(
        {
            "id": turn_id,
            "agent_id": "desk",
            "root_turn_id": root or turn_id,
            "parent_turn_id": root,
            "conversation_id": conversation,
            "root_conversation_id": root_conversation or conversation,
            "tenant_id": tenant,
            "status": status,
            "created_at": NOW,
            "updated_at": NOW,
            **fields,
        }
    )


def _turn_row(turn: AgentTurn) -> dict[str, Any]:
    """The header row earlier versions wrote: every column from the snapshot, NULL for no tenant."""
    row = {column.name: column.value(turn) for column in HEADER}
    row["tenant_id"] = turn.tenant_id
    row["state"] = json.dumps(row["state"])
    return {**row, "status_changed_at": turn.updated_at, "event_position": 0}


def _event_row(
    event_id: str, kind: str, turn: AgentTurn | str, conversation: str, root_position: int, position: int
) -> dict[str, Any]:
    turn_id = turn if isinstance(turn, str) else turn.id
    payload = {
        "event_id": event_id,
        "type": kind,
        "turn_id": turn_id,
        "root_turn_id": turn_id,
        "conversation_id": conversation,
        "timestamp": NOW.isoformat(),
        "data": {"message_id": "m-queued", "sequence": 1} if kind == "MESSAGE_QUEUED" else {},
    }
    return {
        "event_id": event_id,
        "turn_id": turn_id,
        "root_turn_id": turn_id,
        "conversation_id": conversation,
        "type": kind,
        "created_at": NOW,
        "payload": json.dumps(payload),
        "root_position": root_position,
        "conversation_position": position,
    }


def _insert(connection: sa.Connection, table: str, rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    statement = sa.text(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})")
    connection.execute(statement, rows)


def _write_as_earlier_versions(url: str) -> None:
    acme = _earlier_turn(
        "t-acme",
        ACME,
        "acme",
        AgentTurnStatus.COMPLETED,
        messages=[UserMessage(id="u-1", content="hello from acme"), AiMessage(id="a-1", content="hi acme")],
        projected_count=2,
    )
    child = _earlier_turn(
        "t-acme-child", None, "acme", AgentTurnStatus.COMPLETED, root="t-acme", root_conversation=ACME
    )
    globex = _earlier_turn("t-globex", "globex/c-1", "globex", AgentTurnStatus.WAITING_FOR_USER)
    plain = _earlier_turn("t-plain", "c-1", None, AgentTurnStatus.READY)
    engine = store.make_engine(url)
    try:
        migrated_to(engine, "0009")
        with engine.begin() as connection:
            _insert(connection, "agent_turns", [_turn_row(t) for t in (acme, child, globex, plain)])
            connection.execute(sa.text("UPDATE agent_turns SET event_position = 2 WHERE id = 't-acme'"))
            connection.execute(sa.text("UPDATE agent_turns SET event_position = 1 WHERE id <> 't-acme'"))
            _insert(
                connection,
                "agent_turn_events",
                [
                    _event_row("e-1", "TURN_STARTED", acme, ACME, 1, 1),
                    _event_row("e-2", "TURN_COMPLETED", acme, ACME, 2, 2),
                    _event_row("e-3", "MESSAGE_QUEUED", QUEUED_TURN, ACME, 0, 3),
                    _event_row("e-g", "TURN_STARTED", globex, "globex/c-1", 1, 1),
                    _event_row("e-p", "TURN_STARTED", plain, "c-1", 1, 1),
                ],
            )
            _insert(
                connection,
                "agent_event_conversations",
                [
                    {"conversation_id": ACME, "last_position": 3},
                    {"conversation_id": "globex/c-1", "last_position": 1},
                    {"conversation_id": "c-1", "last_position": 1},
                ],
            )
            _insert(connection, "agent_chat_conversations", [{"conversation_id": ACME, "last_seq": 2}])
            _insert(
                connection,
                "agent_chat_messages",
                [
                    {
                        "conversation_id": ACME,
                        "seq": seq,
                        "message_id": message.id,
                        "role": message.role,
                        "model_visible": True,
                        "version": 0,
                        "payload": json.dumps(message.model_dump(mode="json")),
                        "created_at": NOW,
                    }
                    for seq, message in enumerate(acme.messages, 1)
                ],
            )
            _insert(connection, "agent_inbox_conversations", [{"conversation_id": ACME, "last_sequence": 1}])
            _insert(
                connection,
                "agent_inbox_messages",
                [
                    {
                        "message_id": "m-queued",
                        "conversation_id": ACME,
                        "sequence": 1,
                        "content": "queued before the upgrade",
                        "status": "PENDING",
                        "attempts": 0,
                        "created_at": NOW,
                        "updated_at": NOW,
                        "agent_id": "desk",
                        "tenant_id": "acme",
                    }
                ],
            )
            _insert(
                connection,
                "agent_threads",
                [
                    {
                        "conversation_id": ACME,
                        "thread_id": "c-1",
                        "tenant_id": "acme",
                        "metadata": json.dumps({"team": "red"}),
                        "created_at": NOW,
                        "updated_at": NOW,
                    }
                ],
            )
            schedule = {"name": "cron-1", "agent_id": "desk", "input": "tick", "cron": "0 * * * *"}
            _insert(
                connection,
                "agent_crons",
                [
                    {
                        "cron_id": "cron-1",
                        "tenant_id": "acme",
                        "thread_id": "c-1",
                        "assistant_id": "desk",
                        "schedule": json.dumps({**schedule, "conversation_id": ACME, "tenant_id": "acme"}),
                        "payload": json.dumps({}),
                        "enabled": True,
                        "created_at": NOW,
                        "updated_at": NOW,
                    }
                ],
            )
    finally:
        engine.dispose()


@DATABASES
def test_the_upgrade_moves_the_tenant_beside_the_conversation_id_in_every_table(
    database: str, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue(database))
    _write_as_earlier_versions(url)
    # When the database is upgraded
    store.migrate(url)
    assert schema_differences(url) == []
    with store.SqlAgentTurnStore(url) as turns, store.SqlChatMemoryProvider(url) as memories:
        # Then each turn names its conversation by its own id and its tenant
        named = {t.id: (t.tenant_id, t.conversation_id, t.root_conversation_id) for t in turns.list_turns()}
        assert named == {
            "t-acme": ("acme", "c-1", "c-1"),
            "t-acme-child": ("acme", None, "c-1"),
            "t-globex": ("globex", "c-1", "c-1"),
            "t-plain": (None, "c-1", "c-1"),
        }
        # And the three conversations c-1 stay apart: active turns, events and ChatMemory
        found = {tenant: turns.find_active_turn("c-1", tenant) for tenant in ("acme", "globex", None)}
        assert {tenant: None if t is None else t.id for tenant, t in found.items()} == {
            "acme": None,
            "globex": "t-globex",
            None: "t-plain",
        }
        acme_events = turns.read_events(EventScope.conversation("c-1", "acme"))
        assert [(e.event_id, e.cursor, e.conversation_id, e.tenant_id) for e in acme_events] == [
            ("e-1", "1", "c-1", "acme"),
            ("e-2", "2", "c-1", "acme"),
            ("e-3", "3", "c-1", "acme"),
        ]
        assert [e.event_id for e in turns.read_events(EventScope.conversation("c-1", "globex"))] == ["e-g"]
        assert [e.event_id for e in turns.read_events(EventScope.conversation("c-1"))] == ["e-p"]
        # A cursor handed out before the upgrade resumes right after its event
        assert [e.event_id for e in turns.read_events(EventScope.conversation("c-1", "acme"), after="1")] == [
            "e-2",
            "e-3",
        ]
        assert [m.id for m in memories("c-1", tenant_id="acme").get_messages(10)] == ["u-1", "a-1"]
        assert memories("c-1", tenant_id="globex").get_messages(10) == []
        assert memories("c-1").get_messages(10) == []
    with store.Inbox(url) as inbox, store.ThreadRecords(url) as threads, store.CronRecords(url) as crons:
        # And the queued message waits in acme's conversation, to start as the turn its event named
        assert inbox.conversations_ready() == [ConversationKey("c-1", "acme")]
        claimed = inbox.claim_next(ConversationKey("c-1", "acme"))
        assert claimed is not None and claimed.message_id == "m-queued" and claimed.starts_as == QUEUED_TURN
        assert inbox.release_for_retry("m-queued")
        thread = threads.get(ConversationKey("c-1", "acme"))
        assert thread is not None and (thread.thread_id, thread.metadata) == ("c-1", {"team": "red"})
        assert threads.get(ConversationKey("c-1", "globex")) is None
        cron = crons.get("cron-1")
        assert cron is not None and (cron.schedule["conversation_id"], cron.schedule["tenant_id"]) == ("c-1", "acme")


def _client(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("AGENT_RUNNER_API_KEYS", "acme:key-acme,globex:key-globex")
    agent = Agent(id="desk", chat_model=ScriptedChatModel([AiMessage(content="ok")] * 4))
    return TestClient(create_app(database_url=url, worker="none", agents=InMemoryAgentLoader([agent])))


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The (id, data) of each event of a server-sent event stream."""
    found = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            found.append((fields.get("id", ""), json.loads(fields["data"])))
    return found


@DATABASES
def test_clients_keep_their_ids_and_cursors_across_the_upgrade(
    database: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(request.getfixturevalue(database))
    _write_as_earlier_versions(url)
    store.migrate(url)
    acme, globex = {"Authorization": "Bearer key-acme"}, {"Authorization": "Bearer key-globex"}
    with _client(url, tmp_path, monkeypatch) as client:
        # A client of acme that had read its conversation's events up to cursor 1 resumes there
        resumed = client.get("/v1/conversations/c-1/events", params={"after": "1:", "follow": "false"}, headers=acme)
        assert resumed.status_code == 200, resumed.text
        events = _sse(resumed.text)
        assert [(cursor, data["event_id"], data["conversation_id"]) for cursor, data in events] == [
            ("2:", "e-2", "c-1"),
            ("3:", "e-3", "c-1"),
        ]
        assert all("tenant_id" not in data for _, data in events)
        # Its turns and messages show the id it named
        turn = client.get("/v1/turns/t-acme", headers=acme).json()
        assert turn["conversation_id"] == "c-1"
        messages = client.get("/v1/conversations/c-1/messages", headers=acme).json()
        assert [m["id"] for m in messages["items"]] == ["u-1", "a-1"]
        # The other tenant's conversation of the same id is its own: busy with its waiting turn
        busy = client.post(
            "/v1/turns",
            json={"agent_id": "desk", "input": "more", "conversation_id": "c-1", "if_busy": "reject"},
            headers=globex,
        )
        assert busy.status_code == 409 and "'c-1'" in busy.text and "t-globex" in busy.text
        assert client.get("/v1/turns/t-acme", headers=globex).status_code == 404
        # And acme's conversation goes on: a new message queues behind the one queued before,
        # at the next position of its event log, right after the cursors handed out before
        queued = client.post(
            "/v1/turns",
            json={"agent_id": "desk", "input": "and this", "conversation_id": "c-1", "if_busy": "enqueue"},
            headers=acme,
        )
        assert queued.status_code == 202, queued.text
        assert queued.json()["conversation_id"] == "c-1"
        after = _sse(
            client.get("/v1/conversations/c-1/events", params={"after": "3:", "follow": "false"}, headers=acme).text
        )
        # The server's inbox pump may start the message queued before the upgrade meanwhile
        # (acme's conversation is free): its TURN_STARTED then follows, as the turn id it named.
        assert [(cursor, data["type"], data["conversation_id"]) for cursor, data in after[:1]] == [
            ("4:", "MESSAGE_QUEUED", "c-1")
        ]
        assert [(data["type"], data["turn_id"]) for _, data in after[1:2]] in ([], [("TURN_STARTED", QUEUED_TURN)])
