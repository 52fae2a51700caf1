"""A snapshot saved before TOOL_OUTCOME_UNKNOWN existed still waits for a person, and each choice resumes it.

Such a snapshot marked the call whose outcome was unknown with a TOOL_APPROVAL suspension
whose `metadata["reason"]` is `"outcome_unknown"`. The JSON file was written by that
earlier version of the runner: a send_email call that started, after which the worker died.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_runner import (
    ActionStatus,
    Agent,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    ScriptedChatModel,
    SuspensionType,
    Tool,
    ToolMessage,
)

SNAPSHOT = Path(__file__).parent / "snapshots" / "outcome_unknown_before_its_type.json"


def _older_turn() -> AgentTurn:
    text = SNAPSHOT.read_text()
    written = json.loads(text)["suspension"]
    assert (written["type"], written["metadata"]["reason"]) == ("TOOL_APPROVAL", "outcome_unknown")
    return AgentTurn.model_validate_json(text)


class Mailer:
    """The agent of the snapshot: the model had asked for one email, and answers `done` after it."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def agent(self) -> Agent:
        def send_email(to: str) -> str:
            """Send an email."""
            self.sent.append(to)
            return f"sent to {to}"

        return Agent(
            id="mailer",
            chat_model=ScriptedChatModel([AiMessage(content="done")]),
            tools=[Tool(send_email, idempotent=False)],
        )


def _runner(mailer: Mailer) -> tuple[AgentRunner, str]:
    store = InMemoryAgentTurnStore()
    turn = store.save(_older_turn(), -1)
    runner = AgentRunner(
        turn_store=store,
        chat_memory_provider=InMemoryChatMemoryProvider(),
        agent_loader=InMemoryAgentLoader([mailer.agent()]),
    )
    return runner, turn.id


def test_an_older_snapshot_reads_as_an_unknown_outcome_and_is_written_back_as_one() -> None:
    turn = _older_turn()

    assert turn.status is AgentTurnStatus.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and turn.suspension.type is SuspensionType.TOOL_OUTCOME_UNKNOWN
    assert turn.suspension.is_outcome_unknown and turn.suspension.correlation_id == "mail-1"
    written = json.loads(turn.model_dump_json())["suspension"]
    assert (written["type"], written["metadata"]["reason"]) == ("TOOL_OUTCOME_UNKNOWN", "outcome_unknown")
    assert AgentTurn.model_validate_json(turn.model_dump_json()) == turn


@pytest.mark.parametrize(
    ("command", "emails", "result", "is_error", "status"),
    [
        (AgentResumeCommand.approve_tool("mail-1"), 1, "sent to ops@example.com", False, ActionStatus.APPROVED),
        (
            AgentResumeCommand.tool_result("mail-1", "delivered, id 42"),
            0,
            "delivered, id 42",
            False,
            ActionStatus.SUBMITTED,
        ),
        (
            AgentResumeCommand.reject_tool("mail-1", "bounced"),
            0,
            "This tool call failed (its outcome was unknown and a person marked it failed): bounced",
            True,
            ActionStatus.REJECTED,
        ),
    ],
    ids=["retry", "mark-done", "fail"],
)
def test_each_choice_resumes_an_older_snapshot(
    command: AgentResumeCommand, emails: int, result: str, is_error: bool, status: ActionStatus
) -> None:
    mailer = Mailer()
    runner, turn_id = _runner(mailer)

    done = runner.resume(turn_id, command.with_metadata("decided_by", "u-7"))

    assert done.status is AgentTurnStatus.COMPLETED and done.final_output == "done"
    assert mailer.sent == ["ops@example.com"] * emails
    answers = [(m.tool_call_id, m.content, m.is_error) for m in done.messages if isinstance(m, ToolMessage)]
    assert answers == [("mail-1", result, is_error)]
    assert done.started_call_ids == []
    (action,) = done.page_actions
    assert (action.kind, action.status, action.decision["decided_by"]) == ("outcome_unknown", status, "u-7")


@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        (AgentResumeCommand.edit_tool("mail-1", {"to": "dev@example.com"}), "not edited"),
        (AgentResumeCommand.user_input("mail-1", {"to": "dev@example.com"}), "waits for TOOL_OUTCOME_UNKNOWN"),
        (AgentResumeCommand.retry(), "waits for TOOL_OUTCOME_UNKNOWN"),
    ],
    ids=["edit", "form", "retry"],
)
def test_an_older_snapshot_refuses_what_does_not_settle_an_unknown_outcome(
    command: AgentResumeCommand, refusal: str
) -> None:
    mailer = Mailer()
    runner, turn_id = _runner(mailer)

    with pytest.raises(InvalidResumeCommand, match=refusal):
        runner.resume(turn_id, command)

    assert runner.turn_store.load(turn_id).status is AgentTurnStatus.WAITING_FOR_APPROVAL
    assert mailer.sent == []
