"""`AGENT_RUNNER_MODEL_LIMITS`: read once at start-up; a value that cannot be used names the variable."""

from __future__ import annotations

import pytest

from agent_runner import ModelLimit
from workers.settings import SettingsError, WorkerSettings

VARIABLE = "AGENT_RUNNER_MODEL_LIMITS"


def test_limits_are_read_by_key_with_each_field_optional() -> None:
    value = '{"openai:gpt-4o-mini": {"rpm": 500, "tpm": 200000, "concurrency": 20}, "local:llama": {"rpm": 60}}'
    settings = WorkerSettings.from_env({VARIABLE: value})
    assert settings.model_limits == {
        "openai:gpt-4o-mini": ModelLimit(rpm=500, tpm=200_000, concurrency=20),
        "local:llama": ModelLimit(rpm=60),
    }


@pytest.mark.parametrize("value", ["", "   "])
def test_unset_or_empty_means_no_limits(value: str) -> None:
    assert WorkerSettings.from_env({VARIABLE: value}).model_limits == {}
    assert WorkerSettings.from_env({}).model_limits == {}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("rpm=60", "expected a JSON object"),
        ("[1, 2]", "expected a JSON object"),
        ('{"openai:x": 60}', "must be an object"),
        ('{"openai:x": {"rpm": 60, "burst": 5}}', "unknown fields ['burst']"),
        ('{"openai:x": {"rpm": 1.5}}', "must be an integer"),
        ('{"openai:x": {"rpm": "60"}}', "must be an integer"),
        ('{"openai:x": {"rpm": true}}', "must be an integer"),
        ('{"openai:x": {"tpm": 0}}', "must be greater than zero"),
        ('{"openai:x": {"concurrency": -2}}', "must be greater than zero"),
        ('{"": {"rpm": 60}}', "must not be empty"),
    ],
)
def test_a_malformed_value_stops_start_up_naming_the_variable(value: str, reason: str) -> None:
    with pytest.raises(SettingsError) as raised:
        WorkerSettings.from_env({VARIABLE: value})
    assert raised.value.variable == VARIABLE
    assert str(raised.value).startswith(f"{VARIABLE}=")
    assert reason in str(raised.value)


def test_tenant_weights_are_read_and_checked() -> None:
    name = "AGENT_RUNNER_MODEL_TENANT_WEIGHTS"
    assert WorkerSettings.from_env({name: '{"acme": 3, "globex": 1}'}).model_tenant_weights == {"acme": 3, "globex": 1}
    for value in ("acme=3", "[3]", '{"acme": 0}', '{"acme": 1.5}'):
        with pytest.raises(SettingsError) as raised:
            WorkerSettings.from_env({name: value})
        assert raised.value.variable == name
