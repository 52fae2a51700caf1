"""Hostile input to the command line: one `error:` line, the right exit code, no password shown, nothing written."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import store
from agent_runner import AgentRunner, AgentSuspension
from tests.helpers.hostile import (
    NON_UTF8,
    SQL_INJECTION,
    UNENCODED_URLS,
    Deployment,
    assert_no_password_piece,
    hostile_agent,
)
from tests.helpers.processes import REPO_ROOT
from workers.cli import main as cli_main


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(url: str, *args: str) -> CliResult:
    """Run the command line in this process, as the `agent-runner` script runs it."""
    result = CliRunner().invoke(cli_main, ["--database-url", url, *args], catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)


def cli_process(url: str, *args: str | bytes) -> CliResult:
    """Run the command line as a separate process, with arguments given as raw bytes where needed."""
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "--database-url", url, *args],
        capture_output=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    return CliResult(
        result.returncode, result.stdout.decode("utf-8", "replace"), result.stderr.decode("utf-8", "replace")
    )


def assert_one_error_line(result: CliResult, code: int) -> str:
    """The CLI failed with `code` and printed one `error:` line (and schema details at most), no traceback."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), result.stderr
    assert all(line.startswith("  - ") for line in lines[1:]), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def cli_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A SQLite deployment shared by the CLI cases, each of which must leave it unchanged."""
    url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'cli.db'}"
    turn_store = store.SqlAgentTurnStore(url)
    engine = sa.create_engine(url)
    try:
        runner = AgentRunner(turn_store=turn_store)
        form_turn = runner.run(hostile_agent(), "fill in the form")
        approval_turn = runner.run(hostile_agent(), "deploy the api")
        question_turn = runner.suspend(
            runner.start(hostile_agent(), "ask me"), AgentSuspension.user_input("which order?")
        )
        yield Deployment(url, runner, engine, None, "", form_turn, approval_turn, question_turn)
    finally:
        turn_store.close()
        engine.dispose()


CLI_BAD_INPUT: list[Any] = [
    pytest.param(["turns", "list", "--limit", "1e20"], "--limit", id="limit-1e20"),
    pytest.param(["turns", "list", "--limit", "-1"], "--limit", id="limit-negative"),
    pytest.param(["turns", "list", "--limit", "0"], "--limit", id="limit-zero"),
    pytest.param(["turns", "list", "--limit", "abc"], "--limit", id="limit-text"),
    pytest.param(["turns", "list", "--limit", "99999999999999999999"], "--limit", id="limit-huge"),
    pytest.param(["turns", "list", "--status", "NOPE"], "--status", id="status-unknown"),
    pytest.param(["turns", "list", "--conversation", NON_UTF8], "--conversation", id="conversation-non-utf8"),
    pytest.param(["turns", "list", "--conversation", SQL_INJECTION], "--conversation", id="conversation-sql"),
    pytest.param(["turns", "show", ""], "TURN_ID", id="show-empty"),
    pytest.param(["turns", "show", NON_UTF8], "TURN_ID", id="show-non-utf8"),
    pytest.param(["turns", "show", "t" * 100_000], "TURN_ID", id="show-100k-id"),
    pytest.param(["turns", "show", SQL_INJECTION], "TURN_ID", id="show-sql"),
    pytest.param(["turns", "show", "no-such-turn"], "does not exist", id="show-unknown"),
    pytest.param(["cancel", NON_UTF8], "TURN_ID", id="cancel-non-utf8"),
    pytest.param(["cancel", "no-such-turn"], "does not exist", id="cancel-unknown"),
    pytest.param(["cancel", "{approval}", "--reason", NON_UTF8], "--reason", id="cancel-reason-non-utf8"),
    pytest.param(["resume", NON_UTF8, "--retry"], "turn_id", id="resume-non-utf8-turn"),
    pytest.param(["resume", "{question}", "--input", NON_UTF8], "content", id="resume-non-utf8-input"),
    pytest.param(["resume", "{form}", "--form", NON_UTF8, "{}"], "tool_call_id", id="resume-non-utf8-call"),
    pytest.param(["resume", "{form}", "--form", "call-form", "[" * 100_000], "--form", id="form-deep-json"),
    pytest.param(["resume", "{form}", "--form", "call-form", '{"a":' * 65 + "1" + "}" * 65], "64", id="form-65"),
    pytest.param(["resume", "{form}", "--form", "call-form", "{"], "not valid JSON", id="form-broken-json"),
    pytest.param(["resume", "{form}", "--form", "call-form", '{"a": NaN}'], "NaN", id="form-nan"),
    pytest.param(["resume", "{form}", "--form", "call-form", "[1]"], "JSON object", id="form-list"),
    pytest.param(["resume", "{form}", "--form", "call-form", '{"a": ' + "9" * 5000 + "}"], "JSON", id="form-digits"),
    pytest.param(["resume", "{form}", "--form", "call-form", '{"a": "\\u0000"}'], "NUL", id="form-nul-escape"),
    pytest.param(["resume", "{approval}", "--approve", "call-deploy", "--retry"], "exactly one", id="two-actions"),
    pytest.param(["resume", "{approval}"], "exactly one", id="no-action"),
    pytest.param(["resume", "{approval}", "--approve", "wrong-call"], "wrong-call", id="stale-call"),
    pytest.param(
        ["resume", "{approval}", "--approve", "call-deploy", "--reason", NON_UTF8],
        "--reason",
        id="approve-reason-non-utf8",
    ),
    pytest.param(["resume", "{approval}", "--mark-done", NON_UTF8, "x"], "tool_call_id", id="mark-done-non-utf8"),
    pytest.param(["resume", "{question}", "--input", "x", "--reason", "why"], "--reason", id="reason-without-decision"),
    pytest.param(["worker", "--concurrency", "0"], "--concurrency", id="worker-concurrency"),
    pytest.param(["worker", "--lease-ttl", "-5"], "--lease-ttl", id="worker-lease-ttl"),
    pytest.param(["worker", "--lease-ttl", "nan"], "finite", id="worker-lease-ttl-nan"),
    pytest.param(["worker", "--run-for", "inf"], "finite", id="worker-run-for-inf"),
    pytest.param(["no-such-command"], "No such command", id="unknown-command"),
    pytest.param(["turns", "list", "--bogus"], "--bogus", id="unknown-option"),
]


@pytest.mark.parametrize(("arguments", "shown"), CLI_BAD_INPUT)
def test_cli_bad_input_is_one_error_line_with_exit_2(
    cli_deployment: Deployment, arguments: list[str], shown: str
) -> None:
    turns = {
        "{form}": cli_deployment.form_turn.id,
        "{approval}": cli_deployment.approval_turn.id,
        "{question}": cli_deployment.question_turn.id,
    }
    arguments = [turns.get(a, a) for a in arguments]
    before = cli_deployment.digest()
    line = assert_one_error_line(cli(cli_deployment.url, *arguments), 2)
    assert shown in line
    assert cli_deployment.digest() == before


def test_cli_arguments_that_are_not_utf8_are_one_error_line_in_a_real_process(cli_deployment: Deployment) -> None:
    # Given raw bytes as the operating system hands them to the process
    before = cli_deployment.digest()
    question = cli_deployment.question_turn.id
    cases: list[list[str | bytes]] = [["turns", "show", b"\xff\xfe"], ["resume", question, "--input", b"caf\xe9"]]
    for arguments in cases:
        # Then the process prints one line naming the bytes, exits 2 and changes nothing
        line = assert_one_error_line(cli_process(cli_deployment.url, *arguments), 2)
        assert "U+DC" in line or "\\x" in line
    assert cli_deployment.digest() == before


def test_cli_store_failures_are_one_error_line_with_exit_1(tmp_path: Path) -> None:
    # Given a file that is not a database, and a server that does not answer (with a password in its URL)
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"this is not a SQLite file" * 100)
    unreachable = "postgresql+psycopg://user:s3cret-pw@127.0.0.1:1/db"
    for url in (f"sqlite:///{broken}", unreachable):
        for arguments in (["turns", "list"], ["turns", "show", "abc"], ["cancel", "abc"], ["resume", "abc", "--retry"]):
            # Then every command fails with one line, exit 1, and never shows the password
            line = assert_one_error_line(cli(url, *arguments), 1)
            assert "s3cret-pw" not in line
    line = assert_one_error_line(cli_process(unreachable, "turns", "list"), 1)
    assert "s3cret-pw" not in line
    assert broken.read_bytes() == b"this is not a SQLite file" * 100


@pytest.mark.parametrize(
    "url",
    ["postgresql+psycopg//user:s3cret-pw@host/db", "nosuchdriver://user:s3cret-pw@host/db", "postgres:/u:s3cret-pw@h"],
    ids=["no-scheme-separator", "unknown-driver", "one-slash"],
)
def test_cli_malformed_database_url_is_bad_input_and_hides_the_password(url: str) -> None:
    for arguments in (["turns", "list"], ["db", "upgrade"]):
        line = assert_one_error_line(cli(url, *arguments), 2)
        assert "s3cret-pw" not in line and "***" in line


def test_the_cli_refuses_a_database_url_with_unencoded_delimiters_in_one_line_without_the_password() -> None:
    line = assert_one_error_line(cli(UNENCODED_URLS[0], "turns", "list"), 2)
    assert_no_password_piece(line)
