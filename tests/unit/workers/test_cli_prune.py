"""`agent-runner prune --older-than AGE`, run in this process on a SQLite store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from agent_runner import AgentEvent, AgentEventType, AgentTurn, AgentTurnStatus
from agent_runner.persistence import ConversationKey
from store import Inbox, SqlAgentTurnStore
from store.schema import inbox_messages
from workers.cli import main
from workers.cli.db import parse_age


def cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--database-url", url, *args], catch_exceptions=False)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def seed(url: str) -> None:
    """An ended turn from 40 days ago, an ended one from 10 days ago, and an old waiting one."""
    now = datetime.now(UTC)
    with SqlAgentTurnStore(url) as turns:
        for turn_id, status, age in (
            ("ended-40d", AgentTurnStatus.COMPLETED, 40),
            ("ended-10d", AgentTurnStatus.FAILED, 10),
            ("waiting-40d", AgentTurnStatus.WAITING_FOR_USER, 40),
        ):
            when = now - timedelta(days=age)
            turn = AgentTurn(id=turn_id, agent_id="a", status=status, created_at=when, updated_at=when)
            event = AgentEvent(event_id=f"{turn_id}:0:0", type=AgentEventType.TURN_STARTED, turn_id=turn_id)
            turns.save(turn, -1, [event])
    with Inbox(url) as inbox:
        inbox.enqueue("c-1", "m-1", "hello")
        assert inbox.claim_next(ConversationKey("c-1")) is not None
        inbox.mark_completed("m-1", "ended-40d")
        with inbox.engine.begin() as connection:  # marked when its turn started, 40 days ago
            connection.execute(sa.update(inbox_messages).values(updated_at=now - timedelta(days=40)))


def remaining(url: str) -> set[str]:
    with SqlAgentTurnStore(url) as turns:
        return {t.id for t in turns.list_turns(limit=100)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("15m", timedelta(minutes=15)),
        ("90s", timedelta(seconds=90)),
    ],
)
def test_ages_take_a_unit(text: str, expected: timedelta) -> None:
    assert parse_age(text) == expected


def test_prune_removes_turns_that_ended_before_the_age_and_keeps_the_rest(url: str) -> None:
    seed(url)
    result = cli(url, "prune", "--older-than", "30d")
    assert result.exit_code == 0, result.stderr
    assert "pruned 1 turn(s)" in result.stdout
    assert "1 inbox message(s)" in result.stdout
    assert remaining(url) == {"ended-10d", "waiting-40d"}
    # As JSON, and a second run finds the 10-day-old turn once the age allows it
    result = cli(url, "--json", "prune", "--older-than", "7d", "--batch-size", "1")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {
        "pruned_turns": 1,
        "pruned_inbox_messages": 0,
        "pruned_webhook_deliveries": 0,
        "older_than": "7d",
    }
    assert remaining(url) == {"waiting-40d"}


@pytest.mark.parametrize("age", ["30", "30w", "-1d", "0d", "1.5h"])
def test_a_bad_age_exits_2_with_an_error_line(url: str, age: str) -> None:
    seed(url)
    result = cli(url, "prune", "--older-than", age)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "--older-than" in result.stderr
    assert remaining(url) == {"ended-40d", "ended-10d", "waiting-40d"}


def test_a_bad_batch_size_exits_2(url: str) -> None:
    result = cli(url, "prune", "--older-than", "1d", "--batch-size", "0")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --batch-size")
