"""Limits on what callers and models hand the runner, and the checks that enforce them.

Caller input (the message, ids and metadata of `AgentRunner.run`/`start`, the parts of a
resume command) is checked before anything is saved: input over a limit raises
`InputLimitError`, and text that no store can keep (a NUL character, or a lone surrogate
such as a non-UTF-8 command-line argument decodes to) raises `InvalidTextError`. Model
output over a limit is never raised: tool-call arguments that are too big, too deep or
unstorable are answered with an error `ToolMessage`, so the model can correct itself.

Depth is counted in nested containers: `{"a": 1}` is 1 level deep, `{"a": [1]}` 2. Sizes
are the bytes of the compact UTF-8 JSON encoding the SQL store writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar, NewType

from pydantic import Field

from agent_runner._base import PositionalModel
from agent_runner.errors import InputLimitError, InvalidTextError

if TYPE_CHECKING:
    from agent_runner.messages import ToolCall

KIB = 1024
MIB = 1024 * KIB
DAY_S = 24 * 3600

ID_CHARACTERS = "A-Za-z0-9._:-"
"""The characters an id may use (conversation, tenant and turn ids)."""
_ID = re.compile(f"[{ID_CHARACTERS}]+")
TENANT_CHARACTERS = "A-Za-z0-9_-"
"""The characters a tenant name may use."""
MAX_TENANT_LENGTH = 64
"""Longest tenant name, in characters."""
TENANT_PATTERN = re.compile(f"^[{TENANT_CHARACTERS}]{{1,{MAX_TENANT_LENGTH}}}$")
"""The whole rule for tenant names (the tenants of `AGENT_RUNNER_API_KEYS`)."""
_NOT_ID = re.compile(f"[^{ID_CHARACTERS}]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_MAX_INT_BITS = 4096
_PREVIEW_CHARS = 200
REPLACEMENT_CHARACTER = "\ufffd"
MAX_JSON_DEPTH = 128
"""The highest `InputLimits.max_json_depth` allowed: deeper data would exhaust the stack of
recursive consumers (JSON Schema validation of recursive schemas, encoders)."""


class InputLimits(PositionalModel):
    """Size and shape limits on caller input and model output; part of `AgentExecutionPolicy`.

    Every limit has a default that is safe for a public endpoint; raise one only for
    inputs you trust. Sizes are in bytes of UTF-8 JSON.
    """

    _positional: ClassVar[tuple[str, ...]] = (
        "max_json_depth",
        "max_id_length",
        "max_form_data_bytes",
        "max_tool_arguments_bytes",
        "max_message_bytes",
        "max_metadata_bytes",
        "max_start_delay_s",
    )

    max_json_depth: int = Field(default=64, ge=1, le=MAX_JSON_DEPTH)
    """Deepest nesting of JSON objects and arrays (form data, tool arguments, metadata)."""
    max_id_length: int = Field(default=128, ge=1)
    """Longest conversation, tenant, turn or tool-call id, in characters."""
    max_form_data_bytes: int = Field(default=256 * KIB, ge=1)
    """Largest form submission."""
    max_tool_arguments_bytes: int = Field(default=256 * KIB, ge=1)
    """Largest arguments of one tool call made by the model."""
    max_message_bytes: int = Field(default=1 * MIB, ge=1)
    """Largest message text: a user message, a plain-text answer, a rejection reason."""
    max_metadata_bytes: int = Field(default=64 * KIB, ge=1)
    """Largest metadata of a turn or a resume command."""
    max_start_delay_s: int = Field(default=30 * DAY_S, ge=0)
    """Longest wait before a turn started with a delay may run (`AgentRunner.start(not_before=...)`), in seconds."""

    if TYPE_CHECKING:

        def __init__(
            self,
            max_json_depth: int = 64,
            max_id_length: int = 128,
            max_form_data_bytes: int = 256 * KIB,
            max_tool_arguments_bytes: int = 256 * KIB,
            max_message_bytes: int = 1 * MIB,
            max_metadata_bytes: int = 64 * KIB,
            max_start_delay_s: int = 30 * DAY_S,
        ) -> None: ...


DEFAULT_LIMITS = InputLimits()
"""The limits of an `AgentExecutionPolicy()` built with no arguments."""

ConversationId = NewType("ConversationId", str)
"""A conversation id checked by `check_conversation_id`.

It is the id as its tenant named it: the tenant travels beside it (`AgentTurn.tenant_id`,
`ConversationKey`), so the equal conversation ids of two tenants never meet.
"""


# --- Single values -----------------------------------------------------------------------------


def check_id(value: object, field: str, limits: InputLimits = DEFAULT_LIMITS) -> str:
    """Check an id a caller chose (conversation, tenant, turn): 1 to `max_id_length` of `[A-Za-z0-9._:-]`.

    Raises:
        InputLimitError: Not a string, empty, too long, or another character (NUL and lone
            surrogates included).
    """
    allowed = f"1 to {limits.max_id_length} characters of [{ID_CHARACTERS}]"
    text = _sized_string(value, field, allowed, limits.max_id_length)
    if not _ID.fullmatch(text):
        bad = _NOT_ID.search(text)
        assert bad is not None  # the full match failed, so some character is outside the set
        raise InputLimitError(field, allowed, f"the character {_show(bad.group())} at position {bad.start()}")
    return text


def check_tenant_id(value: object, field: str = "tenant_id") -> str:
    """Check a tenant name: 1 to 64 of `[A-Za-z0-9_-]` (see `TENANT_PATTERN`).

    Raises:
        InputLimitError: Not a string, empty, too long, or another character.
    """
    allowed = f"1 to {MAX_TENANT_LENGTH} characters of [{TENANT_CHARACTERS}]"
    text = _string(value, field, allowed)
    if TENANT_PATTERN.match(text) is None:
        if not text:
            raise InputLimitError(field, allowed, "an empty string")
        if len(text) > MAX_TENANT_LENGTH:
            raise InputLimitError(field, allowed, f"{len(text)} characters")
        bad = re.search(f"[^{TENANT_CHARACTERS}]", text)
        assert bad is not None  # right length, so some character is outside the set
        raise InputLimitError(field, allowed, f"the character {_show(bad.group())} at position {bad.start()}")
    return text


def check_conversation_id(
    value: object, field: str = "conversation_id", limits: InputLimits = DEFAULT_LIMITS
) -> ConversationId:
    """Check a conversation id: the id rules (`check_id`). Its tenant is named beside it, never inside.

    Raises:
        InputLimitError: Not a string, or outside the id rules.
    """
    return ConversationId(check_id(value, field, limits))


def check_start_delay(value: object, field: str, limits: InputLimits = DEFAULT_LIMITS) -> float:
    """Check a wait before a turn may start, in seconds: a finite number from 0 to `max_start_delay_s`.

    Raises:
        InputLimitError: Not a number (a bool included), NaN, infinite, negative or too large.
    """
    allowed = f"a number of seconds from 0 to {limits.max_start_delay_s}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputLimitError(field, allowed, _kind(value))
    if not math.isfinite(value) or not 0 <= value <= limits.max_start_delay_s:
        raise InputLimitError(field, allowed, repr(value))
    return float(value)


def check_not_before(
    value: object, now: datetime, field: str = "not_before", limits: InputLimits = DEFAULT_LIMITS
) -> datetime | None:
    """Check when a turn may start: a `datetime` with a time zone at most `max_start_delay_s` after `now`.

    Returns:
        The time in UTC, or None when it is not after `now` (a time in the past means now).

    Raises:
        InputLimitError: Not a `datetime`, a naive one, or further ahead than `max_start_delay_s`.
    """
    allowed = f"a datetime with a time zone, at most {limits.max_start_delay_s} seconds ahead"
    if not isinstance(value, datetime):
        raise InputLimitError(field, allowed, _kind(value))
    if value.utcoffset() is None:
        raise InputLimitError(field, allowed, f"the naive datetime {value.isoformat()}")
    if value <= now:
        return None
    ahead = (value - now).total_seconds()
    if ahead > limits.max_start_delay_s:
        raise InputLimitError(field, allowed, f"{value.isoformat()}, {ahead:.0f} seconds ahead")
    return value.astimezone(UTC)


def check_reference(value: object, field: str, limits: InputLimits = DEFAULT_LIMITS) -> str:
    """Check an id someone else chose (a model's tool-call id, a message id): storable text up to `max_id_length`.

    Model providers pick their own id formats, so only the length and storability are checked.

    Raises:
        InputLimitError: Not a string, empty or too long.
        InvalidTextError: A NUL character or a lone surrogate.
    """
    allowed = f"1 to {limits.max_id_length} characters"
    text = _sized_string(value, field, allowed, limits.max_id_length)
    check_storable(text, field)
    return text


def check_text(value: object, field: str, max_bytes: int) -> str:
    """Check free text: a string that can be stored, at most `max_bytes` in UTF-8.

    Raises:
        InputLimitError: Not a string, or too long.
        InvalidTextError: A NUL character or a lone surrogate.
    """
    text = _string(value, field, f"a string of at most {max_bytes} bytes")
    check_storable(text, field)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InputLimitError(field, f"{max_bytes} bytes", f"{size} bytes")
    return text


def check_storable(text: str, field: str) -> None:
    """Refuse text that no store can keep: NUL characters (PostgreSQL text) and lone surrogates (UTF-8).

    Raises:
        InvalidTextError: Naming the first such character and its position.
    """
    bad = _UNSTORABLE.search(text)
    if bad is not None:
        raise InvalidTextError(field, bad.start(), bad.group())


def storable_text(text: str) -> str:
    """Return `text` with every NUL character and lone surrogate replaced by U+FFFD (for model output)."""
    return _UNSTORABLE.sub(REPLACEMENT_CHARACTER, text)


def bounded_text(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` of UTF-8 and ending with a note saying so; unchanged when it fits.

    For model output, which is kept rather than refused.
    """
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text
    note = f"\n[cut here: the text was {len(encoded)} bytes, over the limit of {max_bytes} bytes]"
    room = max(0, max_bytes - len(note.encode("utf-8")))
    return encoded[:room].decode("utf-8", "ignore") + note


def check_json(value: object, field: str, *, max_bytes: int | None, max_depth: int) -> int | None:
    """Check a JSON value a caller or model supplied and return its encoded size in bytes.

    With `max_bytes=None` the size is neither checked nor computed (None is returned).

    The value is walked without recursion, depth first, so a value nested far beyond
    `max_depth` is refused without exhausting the stack, and the walk stops as soon as
    what it has seen is over `max_bytes`. Allowed: dicts with string keys, lists and
    tuples, strings, booleans, None, integers up to 4096 bits and finite floats.

    Raises:
        InputLimitError: Nested deeper than `max_depth`, larger than `max_bytes`, or not JSON.
        InvalidTextError: A key or string holds a NUL character or a lone surrogate.
    """
    # Each entry: the value, its depth, and where it sits as a (parent, key) chain, which is
    # turned into a path only for an error message.
    stack: list[tuple[object, int, _Where]] = [(value, 0, None)]
    at_least = 0  # never more than the encoded size: characters, quotes, brackets and separators seen
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item) is not None:  # the path is worked out only for the error
                check_storable(item, _field_at(field, where))
            at_least += len(item) + 2  # UTF-8 has at least one byte per character
        elif isinstance(item, Mapping | list | tuple):
            if depth >= max_depth:
                raise _too_deep(field, max_depth, where)
            # Brackets and commas now; each child will add at least one byte more, so a
            # container with millions of children is refused before any is looked at.
            at_least += 1 + max(1, len(item))
            if max_bytes is not None and at_least + len(item) > max_bytes:
                raise _too_big(field, max_bytes)
            if isinstance(item, Mapping):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise InputLimitError(
                            field, "string keys", f"the key {preview(repr(key), 40)} ({_kind(key)}) at {_path(where)}"
                        )
                    if _UNSTORABLE.search(key) is not None:
                        check_storable(key, f"a key of {field} at {_path(where)}")
                    at_least += len(key) + 3  # quotes and colon
                    stack.append((child, depth + 1, (where, key)))
            else:
                stack.extend((child, depth + 1, (where, index)) for index, child in enumerate(item))
        else:
            _check_scalar(item, field, where)
            at_least += 1
        if max_bytes is not None and at_least > max_bytes:
            raise _too_big(field, max_bytes)
    if max_bytes is None:
        return None
    size = len(_COMPACT_JSON.encode(value).encode("utf-8"))
    if size > max_bytes:
        raise InputLimitError(field, f"{max_bytes} bytes", f"{size} bytes")
    return size


_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""`json.dumps(value, ensure_ascii=False, separators=(",", ":"))`, without making an encoder per call."""

_Where = tuple["_Where", str | int] | None
"""Where a value sits in a JSON document: None for the root, else (its parent's place, its key)."""


def _path(where: _Where) -> str:
    """The JSON Pointer of a place, each key bounded in length."""
    keys: list[str] = []
    while where is not None:
        where, key = where
        keys.append(preview(str(key).replace("~", "~0").replace("/", "~1"), 40))
    return "/" + "/".join(reversed(keys)) if keys else "/"


def _field_at(field: str, where: _Where) -> str:
    return field if where is None else f"{field} at {_path(where)}"


# --- What the runner checks --------------------------------------------------------------------


def check_turn_input(
    limits: InputLimits,
    message: object,
    history: Sequence[object] | None = None,
    conversation_id: object = None,
    tenant_id: object = None,
    metadata: object = None,
) -> None:
    """Check what a caller passes to `AgentRunner.run` or `start`, before anything is saved.

    A `message` that is neither a string nor a `UserMessage` is left to the runner, which
    refuses it with a `DefinitionError`.

    Raises:
        InputLimitError: A value over its limit, an id outside the id rules, or metadata
            that is not a JSON object.
        InvalidTextError: Text that cannot be stored.
    """
    from agent_runner.messages import UserMessage

    if isinstance(message, str):
        check_text(message, "message", limits.max_message_bytes)
    elif isinstance(message, UserMessage):
        check_message(limits, message, "message")
    if tenant_id is not None:
        check_id(tenant_id, "tenant_id", limits)
    if conversation_id is not None:
        check_conversation_id(conversation_id, "conversation_id", limits)
    if metadata is not None:
        check_metadata(limits, metadata, "metadata")
    for index, earlier in enumerate(history or ()):
        check_message(limits, earlier, f"history[{index}]")


def check_metadata(limits: InputLimits, metadata: object, field: str = "metadata") -> None:
    """Check caller metadata: a JSON object within `max_metadata_bytes` and `max_json_depth`.

    Raises:
        InputLimitError: Not a JSON object, or over a limit.
        InvalidTextError: Text that cannot be stored.
    """
    if not isinstance(metadata, Mapping):
        raise InputLimitError(field, "a JSON object", _kind(metadata))
    check_json(metadata, field, max_bytes=limits.max_metadata_bytes, max_depth=limits.max_json_depth)


def check_message(limits: InputLimits, message: object, field: str) -> None:
    """Check a message a caller supplies (the new user message, or explicit history).

    Raises:
        InputLimitError: Text over `max_message_bytes`, an over-long id, tool-call
            arguments over their limits, or provider parts over `max_message_bytes`.
        InvalidTextError: Text that cannot be stored.
    """
    from agent_runner.messages import AiMessage, ToolMessage

    message_id = getattr(message, "id", None)
    if message_id is not None:
        check_reference(message_id, f"{field}.id", limits)
    content = getattr(message, "content", None)
    if content is not None:
        check_text(content, f"{field}.content", limits.max_message_bytes)
    if isinstance(message, ToolMessage):
        check_reference(message.tool_call_id, f"{field}.tool_call_id", limits)
        check_text(message.tool_name, f"{field}.tool_name", limits.max_id_length)
    if isinstance(message, AiMessage):
        for index, call in enumerate(message.tool_calls):
            check_tool_call(limits, call, f"{field}.tool_calls[{index}]")
        for index, part in enumerate(message.provider_parts):
            where = f"{field}.provider_parts[{index}]"
            check_text(part.provider, f"{where}.provider", limits.max_id_length)
            check_json(part.data, f"{where}.data", max_bytes=limits.max_message_bytes, max_depth=limits.max_json_depth)


def check_tool_call(limits: InputLimits, call: ToolCall, field: str = "tool call") -> None:
    """Check one tool call: its id, its name, and its arguments against the tool-argument limits.

    Raises:
        InputLimitError: Over a limit.
        InvalidTextError: Text that cannot be stored.
    """
    check_reference(call.id, f"{field}.id", limits)
    check_text(call.name, f"{field}.name", limits.max_id_length)
    check_tool_arguments(limits, call.arguments, f"{field}.arguments")


def check_tool_arguments(limits: InputLimits, arguments: object, field: str = "tool arguments") -> None:
    """Check a tool call's arguments.

    Raises:
        InputLimitError: Over `max_tool_arguments_bytes` or `max_json_depth`, or not JSON.
        InvalidTextError: Text that cannot be stored.
    """
    check_json(arguments, field, max_bytes=limits.max_tool_arguments_bytes, max_depth=limits.max_json_depth)


def preview(text: str, limit: int = _PREVIEW_CHARS) -> str:
    """The start of `text`, storable, with an ellipsis when it was cut; for error messages about big input."""
    shown = storable_text(text[:limit])
    return shown if len(text) <= limit else f"{shown}..."


def _check_scalar(item: object, field: str, where: _Where) -> None:
    if item is None or isinstance(item, bool):
        return
    if isinstance(item, int):
        if item.bit_length() > _MAX_INT_BITS:
            raise InputLimitError(field, f"integers of at most {_MAX_INT_BITS} bits", f"a larger one at {_path(where)}")
    elif isinstance(item, float):
        if not math.isfinite(item):
            raise InputLimitError(field, "finite numbers", f"{item!r} at {_path(where)}")
    else:
        raise InputLimitError(
            field, "JSON values (objects, arrays, strings, numbers, booleans, null)", f"{_kind(item)} at {_path(where)}"
        )


def _too_big(field: str, max_bytes: int) -> InputLimitError:
    return InputLimitError(field, f"{max_bytes} bytes", f"more than {max_bytes} bytes")


def _too_deep(field: str, max_depth: int, where: _Where) -> InputLimitError:
    shown = preview(_path(where), 80)
    return InputLimitError(field, f"{max_depth} levels", f"more than {max_depth} levels of nesting at {shown}")


def _string(value: object, field: str, allowed: str) -> str:
    if not isinstance(value, str):
        raise InputLimitError(field, allowed, _kind(value))
    return value


def _sized_string(value: object, field: str, allowed: str, max_length: int) -> str:
    """`value` as a string of 1 to `max_length` characters."""
    text = _string(value, field, allowed)
    if not text:
        raise InputLimitError(field, allowed, "an empty string")
    if len(text) > max_length:
        raise InputLimitError(field, allowed, f"{len(text)} characters")
    return text


def _kind(value: object) -> str:
    """The type of `value` with its article: "an int", "a set"."""
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _show(character: str) -> str:
    if character.isprintable():
        return repr(character)
    return f"U+{ord(character):04X}"
