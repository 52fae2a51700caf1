"""Listing pages of turns: newest created first, stable cursors, filters including the tenant."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_runner import AgentTurn, AgentTurnStatus, UserMessage
from agent_runner.ids import utcnow
from store import SqlAgentTurnStore
from tests.integration.store.conftest import ZONED_SQL_DATABASES

# Timestamps written and read back must not depend on the session time zone.
pytestmark = pytest.mark.parametrize("sql_url", ZONED_SQL_DATABASES, indirect=True)


def test_pages_are_newest_first_filtered_and_without_messages(sql_url: str) -> None:
    start = utcnow()
    with SqlAgentTurnStore(sql_url) as store:
        for number in range(6):
            store.save(
                AgentTurn(
                    id=f"t{number}",
                    agent_id="a" if number % 2 else "b",
                    conversation_id=f"tenant-{number % 3}/c{number}" if number < 5 else None,
                    tenant_id=f"tenant-{number % 3}",
                    messages=[UserMessage(content=f"m{number}")],
                    created_at=start + timedelta(seconds=number),
                    updated_at=start + timedelta(seconds=10 - number),
                ),
                -1,
            )
        # Newest created first, whatever the update times, paged by (created_at, id)
        first = store.list_page(limit=4)
        assert [t.id for t in first] == ["t5", "t4", "t3", "t2"]
        assert all(t.messages == [] for t in first)
        rest = store.list_page(limit=4, before=(first[-1].created_at, first[-1].id))
        assert [t.id for t in rest] == ["t1", "t0"]
        # Every filter narrows; the tenant is a column filter
        assert [t.id for t in store.list_page(tenant_id="tenant-0")] == ["t3", "t0"]
        assert [t.id for t in store.list_page(tenant_id="tenant-1", agent_id="a")] == ["t1"]
        assert [t.id for t in store.list_page(conversation_id="tenant-2/c2")] == ["t2"]
        assert store.list_page(statuses=[AgentTurnStatus.COMPLETED]) == []
        assert store.list_page(tenant_id="nobody") == []
        assert [t.id for t in store.list_turns(tenant_id="tenant-2")] == ["t2", "t5"]
