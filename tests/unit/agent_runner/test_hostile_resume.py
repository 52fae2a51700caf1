"""Hostile resume commands and turn ids: refused with a typed error before anything is saved.

The cases run on the three waiting turns of a `Deployment` (a form, an approval, a plain
question), on SQLite and on PostgreSQL with the Redis conversation guard.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_runner import (
    AgentResumeCommand,
    AgentRunnerError,
    AgentTurnStatus,
    InputLimitError,
    InvalidTextError,
    ToolMessage,
)
from agent_runner.limits import KIB, MIB
from tests.helpers.hostile import NON_UTF8, SQL_INJECTION, Deployment, assert_refused, nested


def _form(data: Any) -> AgentResumeCommand:
    return AgentResumeCommand.user_input("call-form", data)


RESUME_CASES: list[Any] = [
    # form data
    pytest.param("form", _form(nested(10_000)), InputLimitError, "form data", id="form-10000-deep"),
    pytest.param("form", _form(nested(65)), InputLimitError, "form data", id="form-65-deep"),
    pytest.param("form", _form({"system": "x" * (256 * KIB)}), InputLimitError, "form data", id="form-over-256KiB"),
    pytest.param("form", _form({"system": "x" * 10_000_000}), InputLimitError, "form data", id="form-10MB"),
    pytest.param("form", _form({"system": "a\ud800"}), InvalidTextError, "form data at /system", id="form-surrogate"),
    pytest.param("form", _form({"system": NON_UTF8}), InvalidTextError, "form data", id="form-non-utf8"),
    pytest.param("form", _form({"sys\x00tem": "x"}), InvalidTextError, "a key of form data", id="form-nul-key"),
    pytest.param("form", _form({"system": float("nan")}), InputLimitError, "form data", id="form-nan"),
    pytest.param("form", _form({"system": {1, 2}}), InputLimitError, "form data", id="form-set"),
    pytest.param("form", _form({"n": 10**5000}), InputLimitError, "form data", id="form-huge-int"),
    pytest.param(
        "form", AgentResumeCommand.user_input("c" * 1_000_000, {}), InputLimitError, "tool_call_id", id="call-id-1MB"
    ),
    pytest.param("form", AgentResumeCommand.user_input("c\x00", {}), InvalidTextError, "tool_call_id", id="call-nul"),
    pytest.param("form", AgentResumeCommand.user_input("", {}), InputLimitError, "tool_call_id", id="call-id-empty"),
    # plain-text answers
    pytest.param("question", AgentResumeCommand.user_input("a\x00"), InvalidTextError, "content", id="text-nul"),
    pytest.param("question", AgentResumeCommand.user_input(NON_UTF8), InvalidTextError, "content", id="text-non-utf8"),
    pytest.param(
        "question", AgentResumeCommand.user_input("x" * (MIB + 1)), InputLimitError, "content", id="text-over-1MiB"
    ),
    # decisions
    pytest.param(
        "approval",
        AgentResumeCommand.reject_tool("call-deploy", "x" * (MIB + 1)),
        InputLimitError,
        "reason",
        id="reason-over-1MiB",
    ),
    pytest.param(
        "approval", AgentResumeCommand.reject_tool("call-deploy", "no\x00"), InvalidTextError, "reason", id="reason-nul"
    ),
    pytest.param(
        "approval",
        AgentResumeCommand.approve_tool("call-deploy").with_metadata("k", nested(10_000)),
        InputLimitError,
        "resume metadata",
        id="metadata-deep",
    ),
    pytest.param(
        "approval",
        AgentResumeCommand.approve_tool("call-deploy").with_metadata("k", "x" * (64 * KIB)),
        InputLimitError,
        "resume metadata",
        id="metadata-big",
    ),
    pytest.param(
        "approval",
        AgentResumeCommand.approve_tool("call-deploy").with_metadata("approverId", NON_UTF8),
        InvalidTextError,
        "resume metadata at /approverId",
        id="metadata-non-utf8",
    ),
    pytest.param(
        "approval", AgentResumeCommand.child_completed("c\x00"), InputLimitError, "child_turn_id", id="child-nul"
    ),
]


@pytest.mark.parametrize("entry", ["submit_resume", "resume"])
@pytest.mark.parametrize(("target", "command", "error", "field"), RESUME_CASES)
def test_hostile_resume_commands_are_refused_before_anything_is_saved(
    refusing: Deployment,
    entry: str,
    target: str,
    command: AgentResumeCommand,
    error: type[AgentRunnerError],
    field: str,
) -> None:
    refuse_resume(refusing, entry, target, command, error, field)


def refuse_resume(
    deployment: Deployment,
    entry: str,
    target: str,
    command: AgentResumeCommand,
    error: type[AgentRunnerError],
    field: str,
) -> None:
    """`resume` or `submit_resume` of the `target` turn with `command` raises `error` and writes nothing."""
    turn = {"form": deployment.form_turn, "question": deployment.question_turn, "approval": deployment.approval_turn}
    resume = getattr(deployment.runner, entry)
    assert_refused(deployment, lambda: resume(turn[target].id, command), error, field)


def refuse_turn_id(deployment: Deployment, turn_id: Any) -> None:
    command = AgentResumeCommand.approve_tool("call-deploy")
    assert_refused(deployment, lambda: deployment.runner.submit_resume(turn_id, command), InputLimitError, "turn_id")


HOSTILE_TURN_IDS: list[Any] = ["", "t\x00", "t\ud800", NON_UTF8, "t" * 1_000_000, SQL_INJECTION, "t t", 42]


@pytest.mark.parametrize(
    "turn_id", HOSTILE_TURN_IDS, ids=["empty", "nul", "surrogate", "non-utf8", "1MB", "sql", "space", "int"]
)
def test_hostile_turn_ids_are_refused_by_resume(refusing: Deployment, turn_id: Any) -> None:
    refuse_turn_id(refusing, turn_id)


@pytest.mark.integration
def test_hostile_resume_input_changes_nothing_on_postgresql_with_the_redis_guard(pg_deployment: Deployment) -> None:
    for case in RESUME_CASES:
        target, command, error, field = case.values
        for entry in ("submit_resume", "resume"):
            refuse_resume(pg_deployment, entry, target, command, error, field)
    for turn_id in HOSTILE_TURN_IDS:
        refuse_turn_id(pg_deployment, turn_id)


def test_valid_form_data_with_metacharacters_is_accepted(any_deployment: Deployment) -> None:
    data = {"system": SQL_INJECTION + " \U0001f600", "nested": nested(60, {})}
    turn = any_deployment.runner.resume(any_deployment.form_turn.id, _form(data))
    assert turn.status is AgentTurnStatus.COMPLETED
    tool_message = next(m for m in turn.messages if isinstance(m, ToolMessage))
    assert json.loads(tool_message.content) == data
