"""An MCP server's questions to the user (input-required results) as durable USER_INPUT suspensions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent_runner import (
    AgentResumeCommand,
    AgentRunner,
    AgentTurnStatus,
    InvalidResumeCommand,
    SuspensionType,
)
from agent_runner.mcp import MCPToolset
from store import SqlAgentTurnStore
from tests.helpers.mcp_server import DATES_FORM, DESTINATION_FORM, MCPServerProcess
from tests.integration.mcp.mcp_kit import Model, agent_with, runner_for, tool_results

S = AgentTurnStatus


@contextmanager
def sqlite_runner(path: Path, url: str, model: Model) -> Iterator[AgentRunner]:
    """A runner of its own over one SQLite file, as a process that picks a turn up would build it."""
    agent = agent_with(model, MCPToolset(url, include=["book_trip", "link_account"]))
    with SqlAgentTurnStore(f"sqlite:///{path}") as store:
        yield runner_for(agent, store=store)


def test_a_two_round_form_survives_a_new_process_and_a_server_restart(
    tmp_path: Path, mcp_server: MCPServerProcess
) -> None:
    database = tmp_path / "turns.db"
    with sqlite_runner(database, mcp_server.url, Model(("book_trip", {"traveller": "ann"}))) as runner:
        turn = runner.run("mcp-agent", "book me a trip")

    assert turn.status is S.WAITING_FOR_USER
    suspension = turn.suspension
    assert suspension is not None and suspension.type is SuspensionType.USER_INPUT
    assert suspension.correlation_id == "call-1"
    assert suspension.form is not None and suspension.form.schema == DESTINATION_FORM
    assert suspension.message == "Where to?"
    assert turn.tool_state["call-1"]["request_state"].startswith("v1.")

    # Answer the first question from another process, after the server restarted (same key).
    mcp_server.restart()
    with sqlite_runner(database, mcp_server.url, Model()) as runner:
        with pytest.raises(InvalidResumeCommand, match="does not match the form's schema"):
            runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"town": "Oslo"}))
        turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"city": "Oslo"}))

    assert turn.status is S.WAITING_FOR_USER
    assert turn.suspension is not None and turn.suspension.form is not None
    assert turn.suspension.form.schema == DATES_FORM
    assert turn.suspension.message == "How many nights in Oslo?"
    assert turn.tool_state["call-1"]["round"] == 2

    with sqlite_runner(database, mcp_server.url, Model()) as runner:
        turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"nights": 3}))

    assert turn.status is S.COMPLETED, turn.error
    assert [m.content for m in tool_results(turn)] == ["booked 3 nights in Oslo for ann"]
    assert turn.tool_state == {}
    assert mcp_server.bookings() == {f"{turn.id}:call-1": 1}


def test_a_request_state_the_server_no_longer_accepts_asks_the_person_again(mcp_server: MCPServerProcess) -> None:
    runner = runner_for(agent_with(Model(("book_trip", {"traveller": "bo"})), MCPToolset(mcp_server.url)))
    turn = runner.run("mcp-agent", "book")
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"city": "Rome"}))
    assert turn.suspension is not None and turn.suspension.message == "How many nights in Rome?"

    # Redeployed with a new key: the state sealed before is refused, the call starts over.
    mcp_server.restart(new_key=True)
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"nights": 2}))

    assert turn.status is S.WAITING_FOR_USER
    assert turn.suspension is not None and turn.suspension.form is not None
    assert turn.suspension.form.schema == DESTINATION_FORM
    assert turn.suspension.message is not None
    assert turn.suspension.message.startswith("The service no longer accepted the earlier answers")
    assert turn.suspension.message.endswith("Where to?")

    turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"city": "Rome"}))
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"nights": 2}))
    assert [m.content for m in tool_results(turn)] == ["booked 2 nights in Rome for bo"]


def test_a_url_request_shows_the_link_and_goes_on_when_the_person_is_done(mcp_server: MCPServerProcess) -> None:
    runner = runner_for(agent_with(Model(("link_account", {}), ("link_account", {})), MCPToolset(mcp_server.url)))

    turn = runner.run("mcp-agent", "link my account")

    assert turn.status is S.WAITING_FOR_USER
    assert turn.suspension is not None and turn.suspension.message is not None
    assert "https://example.test/signin?s=1" in turn.suspension.message
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"done": True}))
    assert turn.status is S.WAITING_FOR_USER, "the model calls it again"
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-2", {"done": False}))

    assert turn.status is S.COMPLETED, turn.error
    linked, declined = tool_results(turn)
    assert (linked.content, linked.is_error) == ("account linked", False)
    assert (declined.content, declined.is_error) == ("sign-in decline", True)


def test_a_question_no_form_can_show_fails_the_call_with_a_clear_message(module_mcp_server: MCPServerProcess) -> None:
    runner = runner_for(agent_with(Model(("ask_nested", {})), MCPToolset(module_mcp_server.url)))

    turn = runner.run("mcp-agent", "where do I live")

    assert turn.status is S.COMPLETED, turn.error
    [message] = tool_results(turn)
    assert message.is_error
    assert message.content == (
        "The MCP tool 'ask_nested' asked a question no form can show "
        "(field 'address' is not a plain string, number, boolean or choice), so it failed."
    )


def test_a_turn_cancelled_while_a_question_waits_tells_the_server(mcp_server: MCPServerProcess) -> None:
    runner = runner_for(agent_with(Model(("book_trip", {"traveller": "di"})), MCPToolset(mcp_server.url)))
    turn = runner.run("mcp-agent", "book")
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"city": "Bern"}))
    assert turn.status is S.WAITING_FOR_USER

    cancelled = runner.cancel(turn.id, "changed my mind")

    assert cancelled.status is S.CANCELLED
    assert mcp_server.refused_questions() == ["dates:cancel"]


def test_a_declined_question_tells_the_server_and_the_model_reads_its_answer(mcp_server: MCPServerProcess) -> None:
    model = Model(("book_trip", {"traveller": "eve"}))
    runner = runner_for(agent_with(model, MCPToolset(mcp_server.url)))
    turn = runner.run("mcp-agent", "book")
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("call-1", {"city": "Turin"}))
    assert turn.status is S.WAITING_FOR_USER

    turn = runner.resume(turn.id, AgentResumeCommand.reject_tool("call-1", "not this time"))

    assert turn.status is S.COMPLETED, turn.error
    assert mcp_server.refused_questions() == ["dates:decline"]
    [message] = tool_results(turn)
    assert (message.content, message.is_error) == ("booking declined by the user", True)
    assert turn.final_output == "done: booking declined by the user"
    [card] = [a for a in turn.page_actions if a.action_id == "call-1"]
    assert card.status.value == "REJECTED" and card.decision["reason"] == "not this time"
    assert turn.tool_state == {} and turn.form_data == {}


def test_a_url_question_is_declined_by_rejecting_its_call(mcp_server: MCPServerProcess) -> None:
    runner = runner_for(agent_with(Model(("link_account", {})), MCPToolset(mcp_server.url)))
    turn = runner.run("mcp-agent", "link")
    with pytest.raises(InvalidResumeCommand, match="waits on tool call 'call-1', not 'call-9'"):
        runner.resume(turn.id, AgentResumeCommand.reject_tool("call-9"))
    turn = runner.resume(turn.id, AgentResumeCommand.reject_tool("call-1"))
    [message] = tool_results(turn)
    assert (message.content, message.is_error) == ("sign-in decline", True)
