"""Forms: their definitions, validation of submitted data against a frozen JSON Schema, the request a tool raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from agent_runner.errors import AgentRunnerError, DefinitionError, InputLimitError
from agent_runner.limits import DEFAULT_LIMITS, check_json

FORM_KEY_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


@dataclass(frozen=True)
class AgentFormDefinition:
    """A business form the runner can ask the user to fill in.

    Args:
        key: Stable key the model uses to name the form (`request_user_input(formKey=...)`).
        description: When to use the form; shown to the model and the user.
        schema: The JSON Schema of the form's data. It is frozen into the suspension when
            the turn waits, and submitted data is validated against that frozen copy.
        timeout: How long a person has to fill the form in (a `timedelta` or seconds);
            None waits for ever. The deadline is recorded in the suspension.
        on_timeout: What happens when the deadline passes: `"reject"` answers the call
            with an error ToolMessage saying nobody filled the form in (the model goes on),
            `"submit"` submits `default_data` as if a person had.
        default_data: The data `"submit"` submits; it must match `schema`.
    """

    key: str
    description: str = ""
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    timeout: timedelta | float | None = None
    on_timeout: str = "reject"
    default_data: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        import re

        if not isinstance(self.key, str) or not re.match(FORM_KEY_PATTERN, self.key):
            raise DefinitionError(f"form key {self.key!r} must match {FORM_KEY_PATTERN}")
        if not isinstance(self.schema, dict):
            raise DefinitionError(f"form {self.key!r}: schema must be a JSON Schema object, got {type(self.schema)!r}")
        try:
            jsonschema.validators.validator_for(self.schema).check_schema(self.schema)
        except SchemaError as exc:
            raise DefinitionError(f"form {self.key!r} has an invalid JSON Schema: {exc.message}") from exc
        _check_timeout(self)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form of the definition (as frozen into suspensions)."""
        return {"key": self.key, "description": self.description, "schema": self.schema}


def timeout_delta(value: timedelta | float | None, what: str) -> timedelta | None:
    """`value` as a positive `timedelta` (numbers are seconds); None stays None.

    Raises:
        DefinitionError: The value is not a positive duration.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise DefinitionError(f"{what} must be a timedelta or a number of seconds, got {value!r}")
    delta = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if not delta > timedelta(0):
        raise DefinitionError(f"{what} must be positive, got {value!r}")
    return delta


def _check_timeout(form: AgentFormDefinition) -> None:
    # The definition is frozen: normalize through object.__setattr__, as dataclasses do.
    object.__setattr__(form, "timeout", timeout_delta(form.timeout, f"form {form.key!r}: timeout"))
    if form.on_timeout not in ("reject", "submit"):
        raise DefinitionError(f"form {form.key!r}: on_timeout must be 'reject' or 'submit', got {form.on_timeout!r}")
    if form.on_timeout == "submit":
        if form.default_data is None:
            raise DefinitionError(f"form {form.key!r}: on_timeout='submit' needs default_data")
        errors = validate_form_data(form.schema, form.default_data)
        if errors:
            raise DefinitionError(f"form {form.key!r}: default_data does not match the schema: " + "; ".join(errors))


class FormDataError(str):
    """One schema error of submitted form data: a readable string that also keeps its parts.

    It reads as `"field: message"` (or just the message for an error about the whole
    object) and carries `pointer`, the JSON Pointer of the field the error is about
    (`"/field"`, `"/items/0"`; for a missing required field, that field; `""` for the whole
    object), and `message`, for clients that show each error next to its field.
    """

    pointer: str
    message: str

    def __new__(cls, text: str, pointer: str, message: str) -> FormDataError:
        """Build the error; `text` is its readable form."""
        error = super().__new__(cls, text)
        error.pointer = pointer
        error.message = message
        return error


def validate_form_data(
    schema: dict[str, Any], data: Any, max_depth: int = DEFAULT_LIMITS.max_json_depth
) -> list[FormDataError]:
    """Validate `data` against `schema` and return its errors (empty when valid), ordered by field.

    The depth of `data` is checked first, without recursion: the schema validator recurses
    once per level, so data nested deeper than `max_depth` is reported as one error and
    never reaches it.
    """
    try:
        check_json(data, "form data", max_bytes=None, max_depth=max_depth)
    except InputLimitError as exc:
        return [FormDataError(str(exc), "", str(exc))]
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(e.absolute_path), e.message))
    return [_describe(e) for e in errors]


def _pointer(parts: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _describe(error: jsonschema.ValidationError) -> FormDataError:
    parts = list(error.absolute_path)
    path = "/".join(str(p) for p in parts)
    text = f"{path}: {error.message}" if path else error.message
    if error.validator == "required" and isinstance(error.validator_value, list):
        # A missing field has no value to point at; point at the field itself so that a
        # form can show the error next to it.
        missing = next((n for n in error.validator_value if error.message == f"{n!r} is a required property"), None)
        if isinstance(missing, str):
            parts.append(missing)
    return FormDataError(text, _pointer(parts), error.message)


class AgentFormRequiredException(AgentRunnerError):
    """Raised by a tool, before any side effect, to ask the user for a form.

    The runner suspends the turn for user input; when the data is submitted the tool runs
    again from its start and reads it with `AgentToolContext.current().get_submitted_form_data()`.

    A tool that asks in several rounds passes `state` (JSON): it is saved in the snapshot
    with the suspension and read back with `AgentToolContext.current().get_tool_state()` when
    the tool runs again with the answer, and it may then ask for the next form. Without
    `state`, a second request for the same call is a `FormProtocolError`.

    A person may decline a form (`AgentResumeCommand.reject_tool(call_id, reason)`). With
    `takes_decline`, the tool then runs again and reads `AgentToolContext.current().form_declined`
    (to tell a service that asked, say); without it, the call is answered with an error
    ToolMessage saying the user declined, and the model goes on.
    """

    def __init__(
        self,
        form: AgentFormDefinition,
        message: str | None = None,
        *,
        state: dict[str, Any] | None = None,
        takes_decline: bool = False,
    ) -> None:
        self.form = form
        self.state = state
        self.takes_decline = takes_decline
        self.message = message or form.description or f"please fill in the form {form.key!r}"
        super().__init__(f"the tool needs the form {form.key!r} to be filled in")
