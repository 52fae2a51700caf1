"""Checks shared by the agent_runner unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.agent_runner.turn_kit import MISSHAPEN_EVENTS


@pytest.fixture(autouse=True)
def _events_have_their_payload_shape() -> Iterator[None]:
    """Fail a test in which an `EventLog` received an event whose data does not fit its type's payload model."""
    MISSHAPEN_EVENTS.clear()
    yield
    found = list(MISSHAPEN_EVENTS)
    MISSHAPEN_EVENTS.clear()
    assert not found, f"events that do not fit their payload model: {found}"
