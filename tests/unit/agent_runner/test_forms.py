"""Form definitions."""

from __future__ import annotations

import pytest

from agent_runner import AgentFormDefinition, DefinitionError
from tests.unit.agent_runner.turn_kit import TICKET_SCHEMA


def test_form_definition_takes_key_description_and_schema_and_returns_the_schema_dict() -> None:
    form = AgentFormDefinition("support_ticket_details", "Details", TICKET_SCHEMA)
    assert (form.key, form.description) == ("support_ticket_details", "Details")
    assert form.schema == TICKET_SCHEMA
    assert isinstance(form.schema, dict)


def test_form_definition_accepts_keywords() -> None:
    form = AgentFormDefinition(key="k", description="d", schema={"type": "object"})
    assert form.schema == {"type": "object"}


def test_a_form_with_an_invalid_json_schema_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        AgentFormDefinition(key="k", schema={"type": "no-such-type"})


def test_a_form_key_with_spaces_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        AgentFormDefinition(key="two words")
