"""AG-UI events as the client-protocol tests check them: each one validated against the `ag-ui-protocol` models."""

from __future__ import annotations

from typing import Any

from ag_ui.core import Event
from pydantic import TypeAdapter

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)
"""Validates one AG-UI event (any type) as the protocol's Python models define it."""


def valid(run: dict[str, Any]) -> list[str]:
    """The event types of a run a script printed, after checking each event against the protocol's own models."""
    for event in run["events"]:
        EVENTS.validate_python(event)
    return [str(event["type"]) for event in run["events"]]
