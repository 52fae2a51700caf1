"""The state machine's tables, walked cell by cell: every status pair, every suspension type, every resume fit.

Each table is spelled out here once more, as the specification (DESIGN 4), and the code's
table and its behaviour are held against it: a move added, dropped or left unchecked fails
the cell that names it.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from agent_runner import AgentResumeCommand, AgentSuspension, AgentTurn, AgentTurnStatus, SuspensionType
from agent_runner.errors import InvalidResumeCommand, InvalidTransitionError
from agent_runner.machine._resumes import FITS, apply_resume
from agent_runner.machine._transitions import SUSPENSION_STATUS, TRANSITIONS, transition
from agent_runner.suspensions import ResumeType

S = AgentTurnStatus
T = SuspensionType
R = ResumeType
NOW = datetime(2026, 1, 1, tzinfo=UTC)
ENDINGS = {S.COMPLETED, S.FAILED, S.CANCELLED, S.MAX_ITERATIONS_REACHED, S.MAX_STEPS_REACHED, S.BUDGET_EXCEEDED}

ALLOWED: dict[AgentTurnStatus, set[AgentTurnStatus]] = {
    S.READY: {S.RUNNING, S.WAITING_FOR_USER} | ENDINGS,
    # A step may end in any wait or ending, and a RUNNING turn saves again as RUNNING.
    S.RUNNING: {S.RUNNING, S.WAITING_FOR_USER, S.WAITING_FOR_APPROVAL, S.WAITING_FOR_CHILD, S.RETRY_SCHEDULED}
    | ENDINGS,
    # A person's answer or a cancel; nothing else moves a turn that waits for a person.
    S.WAITING_FOR_USER: {S.RUNNING, S.CANCELLED},
    S.WAITING_FOR_APPROVAL: {S.RUNNING, S.CANCELLED},
    # One child of several ending leaves the parent waiting for the others.
    S.WAITING_FOR_CHILD: {S.WAITING_FOR_CHILD, S.RUNNING, S.CANCELLED},
    S.RETRY_SCHEDULED: {S.RUNNING, S.CANCELLED},
    **{ending: set() for ending in ENDINGS},
}
"""Every status change the machine may make, self-moves included; an ending is final."""

WAITS_AS: dict[SuspensionType, AgentTurnStatus] = {
    T.USER_INPUT: S.WAITING_FOR_USER,
    T.TOOL_APPROVAL: S.WAITING_FOR_APPROVAL,
    T.TOOL_OUTCOME_UNKNOWN: S.WAITING_FOR_APPROVAL,
    T.CHILD_AGENT: S.WAITING_FOR_CHILD,
    T.RETRY: S.RETRY_SCHEDULED,
}

FITS_SPEC: dict[ResumeType, set[SuspensionType]] = {
    R.USER_INPUT: {T.USER_INPUT},
    R.APPROVE_TOOL: {T.TOOL_APPROVAL, T.TOOL_OUTCOME_UNKNOWN},
    R.REJECT_TOOL: {T.TOOL_APPROVAL, T.TOOL_OUTCOME_UNKNOWN, T.USER_INPUT},  # a form on a call: declined
    R.TOOL_RESULT: {T.TOOL_OUTCOME_UNKNOWN},
    R.EDIT_TOOL: {T.TOOL_APPROVAL},
    R.CHILD_COMPLETED: {T.CHILD_AGENT},
    R.RETRY: {T.RETRY},
    R.DEADLINE: set(SuspensionType),
}


def test_the_specification_covers_every_status_suspension_and_command() -> None:
    assert set(ALLOWED) == set(S) and ENDINGS == {s for s in S if s.is_terminal}
    assert set(WAITS_AS) == set(T) == set(SUSPENSION_STATUS)
    assert set(FITS_SPEC) == set(R) == set(FITS)


@pytest.mark.parametrize(("source", "target"), list(itertools.product(S, S)), ids=lambda s: str(s.value))
def test_each_status_pair_moves_exactly_as_the_table_says(source: AgentTurnStatus, target: AgentTurnStatus) -> None:
    turn = AgentTurn(id="t", agent_id="a", root_turn_id="t", status=source)
    allowed = target in ALLOWED[source]
    # The table of the code, cell by cell (a self-move is in it when it is allowed)
    assert (target in TRANSITIONS[source]) is allowed
    # And what `transition` does with the move
    if allowed:
        moved = transition(turn, target, NOW)
        assert (moved.status, moved.updated_at) == (target, NOW)
    else:
        with pytest.raises(InvalidTransitionError):
            transition(turn, target, NOW)


@pytest.mark.parametrize("kind", list(T), ids=lambda t: str(t.value))
def test_each_suspension_type_has_its_waiting_status(kind: SuspensionType) -> None:
    assert SUSPENSION_STATUS[kind] is WAITS_AS[kind]
    assert SUSPENSION_STATUS[kind].is_waiting


def _command(kind: ResumeType) -> AgentResumeCommand:
    return {
        R.USER_INPUT: AgentResumeCommand.user_input("call-1", {"x": 1}),
        R.APPROVE_TOOL: AgentResumeCommand.approve_tool("call-1"),
        R.REJECT_TOOL: AgentResumeCommand.reject_tool("call-1"),
        R.TOOL_RESULT: AgentResumeCommand.tool_result("call-1", "done"),
        R.EDIT_TOOL: AgentResumeCommand.edit_tool("call-1", {"x": 2}),
        R.CHILD_COMPLETED: AgentResumeCommand.child_completed("child-1"),
        R.RETRY: AgentResumeCommand.retry(),
        R.DEADLINE: AgentResumeCommand.deadline_passed("call-1"),
    }[kind]


@pytest.mark.parametrize(("kind", "command"), list(itertools.product(T, R)), ids=lambda v: str(v.value))
def test_each_resume_command_fits_exactly_the_suspensions_the_table_says(
    kind: SuspensionType, command: ResumeType
) -> None:
    assert (kind in FITS[command]) is (kind in FITS_SPEC[command])
    suspension = AgentSuspension(type=kind, correlation_id="call-1")
    turn = AgentTurn(id="t", agent_id="a", root_turn_id="t", status=SUSPENSION_STATUS[kind], suspension=suspension)
    try:
        apply_resume(turn, _command(command), NOW)
    except InvalidResumeCommand as refused:
        # A command that fits may still be refused for what it carries (no such call, no
        # deadline...), never for its type
        misfit = f"waits for {kind}, so a {command} command does not apply" in str(refused) or (
            "tool_result settles only" in str(refused) or "not edited" in str(refused)
        )
        assert misfit is (kind not in FITS_SPEC[command]), str(refused)
    else:
        assert kind in FITS_SPEC[command]
