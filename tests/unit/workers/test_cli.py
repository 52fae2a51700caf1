"""The `agent-runner` command line, run in this process on a SQLite store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    tool,
)
from store import SqlAgentTurnStore, SqlChatMemoryProvider
from workers.cli import main

FORM = AgentFormDefinition(
    key="details",
    description="ticket details",
    schema={"type": "object", "properties": {"system": {"type": "string"}}, "required": ["system"]},
)


@tool(requires_approval=True)
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def _agent(first: AiMessage) -> Agent:
    return Agent(
        id="ops",
        chat_model=ScriptedChatModel([first, AiMessage(content="done")]),
        tools=[deploy, AgentUserInputTool(forms=[FORM])],
    )


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(url: str, *args: str) -> CliResult:
    """Run the command line as the `agent-runner` script runs it (no broker: the embedded runner)."""
    result = CliRunner().invoke(
        main, ["--database-url", url, *args], env={"CELERY_BROKER_URL": ""}, catch_exceptions=False
    )
    return CliResult(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def _waiting_turn(url: str, first: AiMessage) -> AgentTurn:
    store = SqlAgentTurnStore(url)
    try:
        return AgentRunner(turn_store=store).run(_agent(first), "please deploy")
    finally:
        store.close()


def _stored(url: str, turn_id: str) -> AgentTurn:
    store = SqlAgentTurnStore(url)
    try:
        return store.load(turn_id)
    finally:
        store.close()


def test_list_filters_by_a_tenants_conversation(url: str) -> None:
    # Given turns of two tenants, and of none, in conversations of the same id
    store, memories = SqlAgentTurnStore(url), SqlChatMemoryProvider(url)
    try:
        runner = AgentRunner(turn_store=store, chat_memory_provider=memories)
        turns = {
            tenant: runner.start(_agent(AiMessage(content="hi")), "hi", conversation_id="c-1", tenant_id=tenant)
            for tenant in ("tenant-a", "tenant-b", None)
        }
    finally:
        store.close()
        memories.close()
    # When listing one tenant's conversation as TENANT/ID, and the one without a tenant as ID
    listed = cli(url, "--json", "turns", "list", "--conversation", "tenant-a/c-1")
    plain = cli(url, "--json", "turns", "list", "--conversation", "c-1")
    # Then only that conversation's turn is listed, named as it was asked for; a malformed name is refused
    assert listed.returncode == 0, listed.stderr
    assert [(item["id"], item["conversation_id"]) for item in json.loads(listed.stdout)] == [
        (turns["tenant-a"].id, "tenant-a/c-1")
    ]
    assert [(item["id"], item["conversation_id"]) for item in json.loads(plain.stdout)] == [(turns[None].id, "c-1")]
    refused = cli(url, "turns", "list", "--conversation", "tenant-a/c/1")
    assert refused.returncode != 0 and "--conversation" in refused.stderr


APPROVAL = AiMessage(tool_calls=[ToolCall(id="c1", name="deploy", arguments={"service": "api"})])
FORM_REQUEST = AiMessage(tool_calls=[ToolCall(id="f1", name="request_user_input", arguments={"formKey": "details"})])


def test_list_and_show_print_turns_readably_and_as_json(url: str) -> None:
    # Given a turn waiting for approval
    turn = _waiting_turn(url, APPROVAL)
    # When listing and showing it
    listed = cli(url, "turns", "list")
    shown = cli(url, "--json", "turns", "show", turn.id)
    filtered = cli(url, "--json", "turns", "list", "--status", "COMPLETED")
    # Then both succeed, and the JSON parses with the suspension and a history without arguments
    assert listed.returncode == 0 and turn.id in listed.stdout and "WAITING_FOR_APPROVAL" in listed.stdout
    data: dict[str, Any] = json.loads(shown.stdout)
    assert data["status"] == "WAITING_FOR_APPROVAL"
    assert data["suspension"]["correlation_id"] == "c1"
    assert all("arguments" not in item for item in data["history"])
    assert json.loads(filtered.stdout) == []


def test_approve_saves_the_turn_runnable_for_a_worker(url: str) -> None:
    turn = _waiting_turn(url, APPROVAL)
    result = cli(url, "--json", "resume", turn.id, "--approve", "c1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "RUNNING"
    assert _stored(url, turn.id).approved_call_ids == ["c1"]


def test_reject_writes_the_reason_for_the_model(url: str) -> None:
    turn = _waiting_turn(url, APPROVAL)
    result = cli(url, "resume", turn.id, "--reject", "c1", "--reason", "change freeze")
    assert result.returncode == 0, result.stderr
    stored = _stored(url, turn.id)
    assert stored.status is AgentTurnStatus.RUNNING
    reply = stored.messages[-1]
    assert isinstance(reply, ToolMessage) and "change freeze" in reply.content


def test_form_input_is_validated_against_the_frozen_schema(url: str) -> None:
    # Given a turn waiting for a form
    turn = _waiting_turn(url, FORM_REQUEST)
    # When invalid data is submitted, then the CLI exits 2 with the schema error and nothing changes
    bad = cli(url, "resume", turn.id, "--form", "f1", '{"system": 5}')
    assert bad.returncode == 2
    assert "is not of type 'string'" in bad.stderr
    assert _stored(url, turn.id).version == turn.version
    # When valid data is submitted, then the turn is runnable again
    good = cli(url, "resume", turn.id, "--form", "f1", '{"system": "db"}')
    assert good.returncode == 0, good.stderr
    assert _stored(url, turn.id).status is AgentTurnStatus.RUNNING


def test_cancel_closes_out_a_waiting_turn(url: str) -> None:
    turn = _waiting_turn(url, APPROVAL)
    result = cli(url, "cancel", turn.id, "--reason", "not needed")
    assert result.returncode == 0, result.stderr
    stored = _stored(url, turn.id)
    assert stored.status is AgentTurnStatus.CANCELLED
    assert "not needed" in (stored.error or "")


def test_cancel_of_an_ended_turn_exits_2_with_one_line_and_changes_nothing(url: str) -> None:
    turn = _waiting_turn(url, APPROVAL)
    assert cli(url, "cancel", turn.id).returncode == 0
    cancelled = _stored(url, turn.id)
    # When the ended turn is cancelled again
    again = cli(url, "cancel", turn.id, "--reason", "twice")
    # Then the command exits 2 with one line saying so, as HTTP answers 409, and nothing changed
    assert again.returncode == 2, again.stderr
    [line] = again.stderr.splitlines()
    assert line.startswith("error: ") and "already ended (CANCELLED)" in line and turn.id in line
    assert _stored(url, turn.id) == cancelled


@pytest.mark.parametrize(
    "args",
    [
        ("turns", "show", "no-such-turn"),
        ("resume", "no-such-turn", "--approve", "c1"),
        ("cancel", "no-such-turn"),
    ],
)
def test_an_unknown_turn_exits_2_with_a_clear_message(url: str, args: tuple[str, ...]) -> None:
    _waiting_turn(url, APPROVAL)  # creates the database
    result = cli(url, *args)
    assert result.returncode == 2
    assert "no-such-turn" in result.stderr and "does not exist" in result.stderr


def test_a_stale_call_id_is_refused(url: str) -> None:
    turn = _waiting_turn(url, APPROVAL)
    result = cli(url, "resume", turn.id, "--approve", "other-call")
    assert result.returncode == 2
    assert "other-call" in result.stderr


def test_db_upgrade_is_idempotent(url: str) -> None:
    assert cli(url, "db", "upgrade").returncode == 0
    assert cli(url, "db", "upgrade").returncode == 0
