"""Schema errors of form data keep the JSON Pointer of their field, and still read as before."""

from __future__ import annotations

from agent_runner.forms import validate_form_data

SCHEMA = {
    "type": "object",
    "required": ["system", "scope"],
    "properties": {
        "system": {"type": "string"},
        "scope": {"enum": ["ONE", "ALL"]},
        "a/b": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
}


def test_each_error_points_at_its_field() -> None:
    errors = validate_form_data(SCHEMA, {"system": 5, "a/b": "x", "tags": ["ok", 3]})
    assert [(e.pointer, e.message) for e in errors] == [
        ("/scope", "'scope' is a required property"),
        ("/a~1b", "'x' is not of type 'integer'"),
        ("/system", "5 is not of type 'string'"),
        ("/tags/1", "3 is not of type 'string'"),
    ]
    # The readable form is unchanged: "path: message", the bare message at the top level
    assert errors[0] == "'scope' is a required property"
    assert errors[1] == "a/b: 'x' is not of type 'integer'"
    assert errors[3] == "tags/1: 3 is not of type 'string'"


def test_an_error_about_the_whole_object_points_at_the_root() -> None:
    (error,) = validate_form_data({"type": "object"}, [1])
    assert (error.pointer, error.message) == ("", "[1] is not of type 'object'")
    assert validate_form_data(SCHEMA, {"system": "db", "scope": "ALL"}) == []
