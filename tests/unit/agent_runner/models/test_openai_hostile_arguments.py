"""Tool arguments from the OpenAI adapter that are not usable JSON become an error value, never an exception."""

from __future__ import annotations

import json

import pytest

from agent_runner.limits import KIB
from agent_runner.models.openai import parse_tool_arguments
from agent_runner.tools import INVALID_ARGUMENTS_KEY


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[" * 1_000 + "]" * 1_000, "nested"),
        ("[" * 100_000, "nested"),
        ('{"a":' * 65 + "1" + "}" * 65, "64 levels"),
        ('{"a": NaN}', "NaN is not a JSON value"),
        ('{"a": Infinity}', "Infinity is not a JSON value"),
        ('{"a": "\\ud800"}', "lone surrogate"),
        ('{"a": "\\u0000"}', "NUL character"),
        ('{"a": ' + "9" * 5000 + "}", "not valid JSON"),
        ('{"a": "' + "x" * (256 * KIB) + '"}', "over the limit of 262144 bytes"),
    ],
    ids=["1000-deep", "100000-open", "65-deep", "nan", "infinity", "surrogate", "nul", "5000-digits", "over-256KiB"],
)
def test_parse_tool_arguments_never_raises(text: str, error: str) -> None:
    parsed = parse_tool_arguments(text)
    assert list(parsed) == [INVALID_ARGUMENTS_KEY]
    assert error in parsed[INVALID_ARGUMENTS_KEY]["error"]
    assert len(parsed[INVALID_ARGUMENTS_KEY]["raw"]) <= 256 * KIB + 16
    json.dumps(parsed).encode("utf-8")  # storable as it is
