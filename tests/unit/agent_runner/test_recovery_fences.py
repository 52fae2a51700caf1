"""Which pick-ups the recovery budget counts as takeovers, read from the fences alone."""

from __future__ import annotations

import pytest

from agent_runner._runtime.recovery import RESEEDED_GAP, is_takeover
from agent_runner.snapshot import AgentTurn, AgentTurnStatus


def _running(lease_fence: int) -> AgentTurn:
    return AgentTurn(id="t-1", agent_id="a", status=AgentTurnStatus.RUNNING, lease_fence=lease_fence)


@pytest.mark.parametrize(
    ("saved_fence", "fence", "takeover"),
    [
        (10, 11, False),  # the next holder after the one that saved: an ordinary handoff
        (10, 12, True),  # one holder in between took the lease and saved nothing
        (10, 10 + RESEEDED_GAP, True),  # many did: still a takeover
        (10, 11 + RESEEDED_GAP, False),  # the counter was reseeded from the clock (Redis lost it)
        (1_700_000_000_000_000, 1_700_000_004_000_000, False),  # a flush four seconds later
        (10, 10, False),  # the same fence: the holder that saved
        (10, 9, False),  # an older fence never takes over
    ],
)
def test_a_takeover_is_a_small_gap_of_fences_above_the_saved_one(saved_fence: int, fence: int, takeover: bool) -> None:
    assert is_takeover(_running(saved_fence), fence) is takeover


@pytest.mark.parametrize("status", [s for s in AgentTurnStatus if s is not AgentTurnStatus.RUNNING])
def test_only_a_running_turn_is_taken_over(status: AgentTurnStatus) -> None:
    turn = _running(10).model_copy(update={"status": status})
    assert is_takeover(turn, 12) is False
