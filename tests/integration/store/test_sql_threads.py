"""Thread search in SQL: filters on metadata, ids and the status derived from the turns, stable pages, tenants apart."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from agent_runner import AgentTurn, AgentTurnStatus, UserMessage
from agent_runner.ids import utcnow
from agent_runner.persistence import ConversationKey
from store import SqlAgentTurnStore, ThreadQuery, ThreadRecord, ThreadRecords
from tests.integration.store.store_kit import recording

S = AgentTurnStatus


@pytest.fixture
def records(sql_url: str) -> Iterator[ThreadRecords]:
    with SqlAgentTurnStore(sql_url), ThreadRecords(sql_url) as made:  # the turn store migrates a SQLite file
        yield made


def _turn(sql_url: str, turn_id: str, conversation_id: str, status: AgentTurnStatus, age_s: int) -> None:
    moment = utcnow() - timedelta(seconds=age_s)
    with SqlAgentTurnStore(sql_url) as turns:
        turns.save(
            AgentTurn(
                id=turn_id,
                agent_id="a",
                conversation_id=conversation_id,
                tenant_id="t1",
                status=status,
                messages=[UserMessage(content=turn_id)],
                created_at=moment,
                updated_at=moment,
            ),
            -1,
        )


def _ids(found: list[ThreadRecord]) -> list[str]:
    return [record.thread_id for record in found]


def test_status_comes_from_the_active_turn_else_the_newest_one(records: ThreadRecords, sql_url: str) -> None:
    for name in ("idle", "busy", "interrupted", "error", "fresh", "recovered"):
        records.create(ConversationKey(f"{name}", "t1"), name, {})
    _turn(sql_url, "i1", "idle", S.COMPLETED, 30)
    _turn(sql_url, "b1", "busy", S.FAILED, 30)
    _turn(sql_url, "b2", "busy", S.RUNNING, 10)
    _turn(sql_url, "w1", "interrupted", S.WAITING_FOR_APPROVAL, 10)
    _turn(sql_url, "e1", "error", S.COMPLETED, 30)
    _turn(sql_url, "e2", "error", S.MAX_STEPS_REACHED, 10)
    _turn(sql_url, "r1", "recovered", S.FAILED, 30)
    _turn(sql_url, "r2", "recovered", S.CANCELLED, 10)
    expected = {
        "idle": {"idle", "fresh", "recovered"},
        "busy": {"busy"},
        "interrupted": {"interrupted"},
        "error": {"error"},
    }
    for status, names in expected.items():
        assert set(_ids(records.search(ThreadQuery("t1", status=status), limit=100))) == names, status  # type: ignore[arg-type]
        assert records.count(ThreadQuery("t1", status=status)) == len(names)  # type: ignore[arg-type]
    by_status = _ids(records.search(ThreadQuery("t1", sort_by="status", descending=False), limit=100))
    assert by_status.index("busy") < by_status.index("error") < by_status.index("idle") < by_status.index("interrupted")


def test_metadata_ids_and_tenants_filter(records: ThreadRecords) -> None:
    records.create(ConversationKey("a", "t1"), "a", {"team": "red", "n": 1, "vip": True, "tags": ["x"], "note": None})
    records.create(ConversationKey("b", "t1"), "b", {"team": "red", "n": 2})
    records.create(ConversationKey("c", "t1"), "c", {"team": "blue", "n": "1"})
    records.create(ConversationKey("a", "t2"), "a", {"team": "red", "n": 1})
    records.create(ConversationKey("gone", "t1"), "gone", {"team": "red"})
    records.delete(ConversationKey("gone", "t1"))
    records.create(ConversationKey("solo"), "solo", {"team": "red"})

    def found(**filters: object) -> set[str]:
        return set(_ids(records.search(ThreadQuery("t1", **filters), limit=100)))  # type: ignore[arg-type]

    assert found() == {"a", "b", "c"}
    assert found(metadata={"team": "red"}) == {"a", "b"}
    assert found(metadata={"team": "red", "n": 2}) == {"b"}
    assert found(metadata={"n": 1}) == {"a"}  # the number, not the string "1"
    assert found(metadata={"n": "1"}) == {"c"}
    assert found(metadata={"vip": True}) == {"a"}
    assert found(metadata={"vip": False}) == set()
    assert found(metadata={"note": None}) == {"a"}
    assert found(metadata={"tags": ["x"]}) == {"a"}
    assert found(metadata={"team": "green"}) == set()
    assert found(metadata={"missing": "red"}) == set()
    assert found(thread_ids=["a", "c", "solo"]) == {"a", "c"}
    assert found(conversation_id="b") == {"b"}
    # Another tenant, and the single-tenant owner, see only their own
    assert _ids(records.search(ThreadQuery("t2", metadata={"team": "red"}), limit=100)) == ["a"]
    assert records.search(ThreadQuery("t2", thread_ids=["b"]), limit=100) == []
    assert _ids(records.search(ThreadQuery(None), limit=100)) == ["solo"]
    assert records.count(ThreadQuery("t1", metadata={"team": "red"})) == 2
    assert records.count(ThreadQuery("t3")) == 0


def test_pages_neither_repeat_nor_miss_a_thread_and_cost_one_statement(records: ThreadRecords, sql_url: str) -> None:
    for number in range(23):
        records.create(ConversationKey(f"{number:02}", "t1"), f"{number:02}", {"kind": "page"})
    records.create(ConversationKey("x", "t2"), "x", {"kind": "page"})
    _turn(sql_url, "late", "05", S.COMPLETED, 0)  # updated last: first by update time
    for sort_by in ("created_at", "updated_at", "thread_id", "status"):
        for descending in (True, False):
            query = ThreadQuery("t1", metadata={"kind": "page"}, sort_by=sort_by, descending=descending)
            with recording(records.engine) as recorded:
                pages = [records.search(query, limit=5, offset=offset) for offset in range(0, 25, 5)]
            assert recorded.statements == ["SELECT"] * 5, sort_by  # one statement per page, no per-thread reads
            assert [len(page) for page in pages] == [5, 5, 5, 5, 3]
            seen = [thread for page in pages for thread in _ids(page)]
            assert sorted(seen) == [f"{number:02}" for number in range(23)], (sort_by, descending)
    newest_first = records.search(ThreadQuery("t1"), limit=30)
    assert [r.created_at for r in newest_first] == sorted((r.created_at for r in newest_first), reverse=True)
    assert newest_first[0].thread_id == "22" and newest_first[-1].thread_id == "00"
    assert _ids(records.search(ThreadQuery("t1", sort_by="updated_at"), limit=1)) == ["05"]
    assert _ids(records.search(ThreadQuery("t1", sort_by="thread_id", descending=False), limit=2)) == ["00", "01"]
