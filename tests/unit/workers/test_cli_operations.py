"""The command line in operation on SQLite: decisions and deadlines in `turns show`, missing databases, schedules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    tool,
)
from agent_runner.persistence import EventScope
from store import SqlAgentTurnStore
from workers.cli import main

RECORDED: list[AgentEvent] = []


def record_events(runner: AgentRunner) -> None:
    """An `AGENT_RUNNER_SETUP` function: every event of the runner is recorded here."""
    runner.add_event_listener(RECORDED.append)


@tool(requires_approval=True, approval_timeout=600, on_timeout="reject")
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def _agent() -> Agent:
    return Agent(
        id="ops",
        chat_model=ScriptedChatModel(
            [
                AiMessage(tool_calls=[ToolCall(id="c1", name="deploy", arguments={"service": "api"})]),
                AiMessage(content="ok"),
            ]
        ),
        tools=[deploy],
    )


def _waiting(url: str) -> AgentTurn:
    with SqlAgentTurnStore(url) as turn_store:
        return AgentRunner(turn_store=turn_store).run(_agent(), "deploy the api")


def _invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    # No broker and a SQLite URL: the embedded runner, whatever the caller's environment holds.
    return CliRunner().invoke(main, list(args), env={"CELERY_BROKER_URL": "", **(env or {})}, catch_exceptions=False)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ops.db'}"


def test_turns_show_prints_the_deadline_of_a_waiting_approval(url: str) -> None:
    turn = _waiting(url)
    assert turn.suspension is not None and turn.suspension.deadline is not None

    human = _invoke("--database-url", url, "turns", "show", turn.id)
    shown = json.loads(_invoke("--database-url", url, "--json", "turns", "show", turn.id).output)

    assert human.exit_code == 0, human.output
    assert f"deadline {turn.suspension.deadline.isoformat()}, then reject" in human.output
    assert shown["suspension"]["deadline"] == turn.suspension.deadline.isoformat()
    assert shown["suspension"]["on_timeout"] == "reject"
    assert shown["decisions"] == [
        {
            "action_id": "c1",
            "kind": "approval",
            "tool_name": "deploy",
            "form_key": None,
            "status": "PENDING",
            "decided_by": None,
            "decided_at": None,
            "reason": None,
        }
    ]


def test_turns_show_prints_who_decided_each_action_when_and_why(url: str) -> None:
    turn = _waiting(url)
    with SqlAgentTurnStore(url) as turn_store:
        command = AgentResumeCommand.reject_tool("c1", "change freeze").with_metadata("approverId", "u-100")
        decided = AgentRunner(turn_store=turn_store).submit_resume(turn.id, command)
    decided_at = decided.page_actions[0].decision["decided_at"]

    human = _invoke("--database-url", url, "turns", "show", turn.id)
    shown = json.loads(_invoke("--database-url", url, "--json", "turns", "show", turn.id).output)

    assert f"approval c1 (deploy): REJECTED by u-100 at {decided_at} - change freeze" in human.output
    (decision,) = shown["decisions"]
    assert (decision["status"], decision["decided_by"], decision["decided_at"], decision["reason"]) == (
        "REJECTED",
        "u-100",
        decided_at,
        "change freeze",
    )


@pytest.mark.parametrize(
    "args",
    [
        ("turns", "list"),
        ("turns", "show", "some-turn"),
        ("resume", "some-turn", "--approve", "c1"),
        ("cancel", "some-turn"),
        ("prune", "--older-than", "30d"),
    ],
)
def test_commands_on_turns_refuse_a_database_file_that_does_not_exist(tmp_path: Path, args: tuple[str, ...]) -> None:
    missing = tmp_path / "elsewhere" / "absent.db"
    result = _invoke(*args, env={"AGENT_RUNNER_DATABASE_URL": f"sqlite:///{missing}"})

    assert result.exit_code == 2
    assert f"no database at sqlite:///{missing} (from AGENT_RUNNER_DATABASE_URL)" in result.output
    assert not missing.exists() and not missing.parent.exists()


def test_the_error_says_where_the_url_came_from(tmp_path: Path) -> None:
    missing = tmp_path / "absent.db"
    flag = _invoke("--database-url", f"sqlite:///{missing}", "turns", "list")
    assert "(from --database-url)" in flag.output and flag.exit_code == 2


def test_an_empty_listing_names_the_database_it_read(url: str) -> None:
    _invoke("--database-url", url, "db", "upgrade")
    result = _invoke("--database-url", url, "turns", "list")
    assert result.exit_code == 0
    assert result.output.strip() == f"no turns in {url} (from --database-url)"


def test_resume_on_the_embedded_runner_applies_the_runner_setup(url: str) -> None:
    turn = _waiting(url)
    RECORDED.clear()

    result = _invoke(
        "--database-url",
        url,
        "resume",
        turn.id,
        "--approve",
        "c1",
        env={"AGENT_RUNNER_SETUP": f"{__name__}:record_events"},
    )

    assert result.exit_code == 0, result.output
    assert [(e.type, e.turn_id) for e in RECORDED] == [(AgentEventType.TURN_RESUMED, turn.id)]


def _decision(url: str, turn_id: str) -> dict[str, Any]:
    shown = json.loads(_invoke("--database-url", url, "--json", "turns", "show", turn_id).output)
    (decision,) = shown["decisions"]
    assert isinstance(decision, dict)
    return decision


@pytest.mark.parametrize(
    ("flag", "reason", "status", "recorded"),
    [
        ("--approve", "change window is open", "APPROVED", "change window is open"),
        ("--approve", None, "APPROVED", None),
        ("--reject", "change freeze", "REJECTED", "change freeze"),
        ("--reject", None, "REJECTED", "rejected by the operator"),
    ],
)
def test_an_approval_decision_records_who_decided_and_the_reason_given(
    url: str, flag: str, reason: str | None, status: str, recorded: str | None
) -> None:
    # Given a waiting approval
    turn = _waiting(url)

    # When an operator decides it from the command line, with or without a reason
    args = ["--database-url", url, "resume", turn.id, flag, "c1", *(["--reason", reason] if reason else [])]
    result = _invoke(*args, env={"USER": "op-7"})

    # Then the decision names the operator and the reason, in `turns show` and in the resume event
    assert result.exit_code == 0, result.output
    decision = _decision(url, turn.id)
    assert (decision["status"], decision["decided_by"], decision["reason"]) == (status, "op-7", recorded)
    human = _invoke("--database-url", url, "turns", "show", turn.id).output
    line = f"approval c1 (deploy): {status} by op-7 at {decision['decided_at']}"
    assert line + (f" - {recorded}" if recorded else "") in [shown.strip() for shown in human.splitlines()]
    with SqlAgentTurnStore(url) as turn_store:
        (resumed,) = [
            e for e in turn_store.read_events(EventScope.tree(turn.id)) if e.type is AgentEventType.TURN_RESUMED
        ]
    assert resumed.data["metadata"]["decided_by"] == "op-7"
    assert (resumed.data.get("reason") or resumed.data["metadata"].get("reason")) == recorded


class ProcessDied(BaseException):
    """Stands for the process being killed while a tool ran: nothing catches it, nothing after it runs."""


@tool(idempotent=False)
def pay(order_id: str) -> str:
    """Pay an order (running it twice pays twice)."""
    raise ProcessDied  # the payment went out; the process died before its result was saved


def _outcome_unknown(url: str) -> AgentTurn:
    """A turn whose `pay` call started and never recorded a result: it waits for a person to settle it."""
    agent = Agent(
        id="payer",
        chat_model=ScriptedChatModel(
            [
                AiMessage(tool_calls=[ToolCall(id="p1", name="pay", arguments={"order_id": "O-7"})]),
                AiMessage(content="paid"),
            ]
        ),
        tools=[pay],
    )
    with SqlAgentTurnStore(url) as turn_store:
        runner = AgentRunner(turn_store=turn_store)
        started = runner.start(agent, "pay O-7")
        with pytest.raises(ProcessDied):
            runner.run_until_blocked(started)
        waiting = runner.run_until_blocked(turn_store.load(started.id))
    assert waiting.status is AgentTurnStatus.WAITING_FOR_APPROVAL
    assert waiting.suspension is not None and waiting.suspension.is_outcome_unknown
    return waiting


def test_mark_done_settles_a_call_whose_outcome_is_unknown_with_its_result_and_reason(url: str) -> None:
    # Given a call whose outcome is unknown
    turn = _outcome_unknown(url)

    # When an operator who checked the bank marks it done
    result = _invoke(
        "--database-url",
        url,
        "--json",
        "resume",
        turn.id,
        "--mark-done",
        "p1",
        "the bank shows O-7 paid",
        "--reason",
        "checked the statement",
        env={"USER": "op-7"},
    )

    # Then the call's result is the one given (it did not run again), and the decision says who and why
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["status"] == "RUNNING"
    with SqlAgentTurnStore(url) as turn_store:
        settled = turn_store.load(turn.id)
    assert [(m.tool_call_id, m.content, m.is_error) for m in settled.messages if isinstance(m, ToolMessage)] == [
        ("p1", "the bank shows O-7 paid", False)
    ]
    decision = _decision(url, turn.id)
    assert (decision["kind"], decision["status"], decision["decided_by"], decision["reason"]) == (
        "outcome_unknown",
        "SUBMITTED",
        "op-7",
        "checked the statement",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--input", "hello", "--reason", "why"), "--reason goes with --approve, --reject or --mark-done"),
        (("--retry", "--reason", "why"), "--reason goes with --approve, --reject or --mark-done"),
        (("--mark-done", "c1", "done", "--approve", "c1"), "give exactly one of"),
        (("--approve", "c1", "--reason", "a\x00b"), "--reason"),
    ],
)
def test_resume_refuses_a_reason_without_a_decision_and_two_decisions_at_once(
    url: str, args: tuple[str, ...], message: str
) -> None:
    turn = _waiting(url)
    result = _invoke("--database-url", url, "resume", turn.id, *args)
    assert result.exit_code == 2 and message in result.output, result.output
    with SqlAgentTurnStore(url) as turn_store:
        assert turn_store.load(turn.id).version == turn.version


@pytest.fixture
def schedules_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "schedules.json"
    path.write_text(
        json.dumps(
            [
                {
                    "name": "nightly",
                    "agent_id": "ops",
                    "input": "report",
                    "cron": "0 2 * * *",
                    "timezone": "Europe/Paris",
                },
                {"name": "ping", "agent_id": "ops", "input": "ping", "every": "5m", "conversation_id": "c"},
            ]
        )
    )
    yield path


def test_schedules_list_shows_each_schedule_and_its_next_run(schedules_file: Path) -> None:
    human = _invoke("schedules", "list", "--schedules", str(schedules_file))
    listed: list[dict[str, Any]] = json.loads(
        _invoke("--json", "schedules", "list", env={"AGENT_RUNNER_SCHEDULES": str(schedules_file)}).output
    )

    assert human.exit_code == 0, human.output
    lines = human.output.splitlines()
    assert lines[0].startswith("nightly") and "cron 0 2 * * * (Europe/Paris)" in lines[0]
    assert lines[1].startswith("ping") and "every 300s" in lines[1] and "conversation c" in lines[1]
    assert "agent-runner worker" in lines[2] and "agent-runner serve" in lines[2] and "beat" in lines[2]
    assert [item["name"] for item in listed] == ["nightly", "ping"]
    nightly = listed[0]["next_run"]
    assert nightly.endswith(("T01:00:00+00:00", "T00:00:00+00:00"))  # 02:00 in Paris, winter or summer


def test_schedules_list_refuses_a_bad_definition(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"name": "x", "agent_id": "ops", "input": "y", "cron": "0 25 * * *"}]))
    result = _invoke("schedules", "list", "--schedules", str(path))
    assert result.exit_code == 2
    assert "cron '0 25 * * *' is invalid" in result.output
