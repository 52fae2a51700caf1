"""Who decides from the command line: `--by`, else `$USER`, else a refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agent_runner import Agent, AgentRunner, AgentTurn, AgentTurnStatus, AiMessage, ScriptedChatModel, ToolCall, tool
from store import SqlAgentTurnStore
from workers.cli import main


@tool(requires_approval=True)
def restart(service: str) -> str:
    """Restart a service."""
    return f"restarted {service}"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'decider.db'}"


def _waiting(url: str) -> AgentTurn:
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name="restart", arguments={"service": "api"})]), AiMessage("ok")]
    )
    with SqlAgentTurnStore(url) as turn_store:
        return AgentRunner(turn_store=turn_store).run(Agent(id="ops", chat_model=model, tools=[restart]), "restart")


def _invoke(url: str, *args: str) -> Result:
    # No broker and a SQLite URL: the embedded runner.
    return CliRunner().invoke(main, ["--database-url", url, *args], env={"CELERY_BROKER_URL": ""})


def _decision(url: str, turn_id: str) -> dict[str, Any]:
    (decision,) = json.loads(_invoke(url, "--json", "turns", "show", turn_id).output)["decisions"]
    assert isinstance(decision, dict)
    return decision


@pytest.mark.parametrize("flag", ["--approve", "--reject"])
def test_by_names_the_decider_over_user(url: str, flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a waiting approval and an operator logged in as op-7
    monkeypatch.setenv("USER", "op-7")
    turn = _waiting(url)
    # When: the decision is taken for someone else
    result = _invoke(url, "resume", turn.id, flag, "c1", "--by", "alice@example.com")
    # Then: that person is recorded as the decider
    assert result.exit_code == 0, result.output
    assert _decision(url, turn.id)["decided_by"] == "alice@example.com"


def test_user_is_the_decider_without_by(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "op-7")
    turn = _waiting(url)
    assert _invoke(url, "resume", turn.id, "--approve", "c1").exit_code == 0
    assert _decision(url, turn.id)["decided_by"] == "op-7"


@pytest.mark.parametrize(
    "args",
    [
        ("resume", "{turn}", "--approve", "c1"),
        ("resume", "{turn}", "--reject", "c1"),
        ("resume", "{turn}", "--mark-done", "c1", "done"),
        ("resume", "{turn}", "--input", "hello"),
        ("resume", "{turn}", "--form", "c1", "{}"),
        ("resume", "{turn}", "--retry"),
        ("cancel", "{turn}"),
    ],
)
def test_a_decision_without_by_or_user_is_refused_in_one_line(
    url: str, args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given: no $USER (a container, a cron job) and no --by
    monkeypatch.delenv("USER", raising=False)
    turn = _waiting(url)
    # When: a decision is attempted
    result = _invoke(url, *(turn.id if a == "{turn}" else a for a in args))
    # Then: it is refused with one clear line, and the turn is unchanged
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["error: say who decides: $USER is not set; pass --by NAME"]
    with SqlAgentTurnStore(url) as turn_store:
        assert turn_store.load(turn.id).version == turn.version


def test_an_empty_by_is_refused(url: str) -> None:
    turn = _waiting(url)
    result = _invoke(url, "resume", turn.id, "--approve", "c1", "--by", " ")
    assert result.exit_code == 2 and "--by is empty" in result.output


def test_cancel_settles_the_pending_card_as_decided_by_the_canceller(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("USER", raising=False)
    turn = _waiting(url)
    result = _invoke(url, "cancel", turn.id, "--by", "ops-lead", "--reason", "wrong service")
    assert result.exit_code == 0, result.output
    with SqlAgentTurnStore(url) as turn_store:
        assert turn_store.load(turn.id).status is AgentTurnStatus.CANCELLED
    decision = _decision(url, turn.id)
    assert (decision["status"], decision["decided_by"], decision["reason"]) == (
        "CANCELLED",
        "ops-lead",
        "wrong service",
    )
