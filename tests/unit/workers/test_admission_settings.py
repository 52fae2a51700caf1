"""The settings of the admission of new turns: off unless a window is set; a value that cannot be used names its variable."""

from __future__ import annotations

import pytest

from workers.settings import SettingsError, WorkerSettings

WINDOW = "AGENT_RUNNER_ADMISSION_WINDOW"
CAP = "AGENT_RUNNER_TENANT_MAX_IN_FLIGHT"
WEIGHTS = "AGENT_RUNNER_ADMISSION_TENANT_WEIGHTS"
MODEL_WEIGHTS = "AGENT_RUNNER_MODEL_TENANT_WEIGHTS"
SLOT_LEASE = "AGENT_RUNNER_ADMISSION_SLOT_LEASE_S"


def test_admission_is_off_by_default() -> None:
    settings = WorkerSettings.from_env({})
    assert settings.admission_window is None
    assert settings.tenant_max_in_flight is None
    assert settings.admission_tenant_weights == {}
    assert settings.admission_slot_lease_s == 300.0


def test_every_admission_setting_is_read() -> None:
    settings = WorkerSettings.from_env(
        {WINDOW: "8", CAP: "50", WEIGHTS: '{"acme": 3}', SLOT_LEASE: "120", MODEL_WEIGHTS: '{"acme": 9}'}
    )
    assert settings.admission_window == 8
    assert settings.tenant_max_in_flight == 50
    assert settings.admission_tenant_weights == {"acme": 3}
    assert settings.model_tenant_weights == {"acme": 9}
    assert settings.admission_slot_lease_s == 120.0


def test_admission_weights_default_to_the_model_weights() -> None:
    settings = WorkerSettings.from_env({WINDOW: "4", MODEL_WEIGHTS: '{"acme": 2}'})
    assert settings.admission_tenant_weights == {"acme": 2}


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        (WINDOW, "0", "must be at least 1"),
        (WINDOW, "-3", "must be at least 1"),
        (WINDOW, "2.5", "expected an integer"),
        (WINDOW, "many", "expected an integer"),
        (CAP, "0", "must be at least 1"),
        (CAP, "ten", "expected an integer"),
        (WEIGHTS, "acme=3", "expected a JSON object"),
        (WEIGHTS, "[3]", 'expected {"<tenant>": weight, ...}'),
        (WEIGHTS, '{"acme": 0}', "whole number above zero"),
        (WEIGHTS, '{"acme": 1.5}', "whole number above zero"),
        (SLOT_LEASE, "0", "must be at least 1"),
        (SLOT_LEASE, "soon", "expected a number"),
    ],
)
def test_a_malformed_value_stops_start_up_naming_the_variable(variable: str, value: str, reason: str) -> None:
    with pytest.raises(SettingsError) as raised:
        WorkerSettings.from_env({WINDOW: "4", variable: value})
    assert raised.value.variable == variable
    assert reason in str(raised.value)


def test_a_cap_without_admission_is_refused() -> None:
    with pytest.raises(SettingsError) as raised:
        WorkerSettings.from_env({CAP: "5"})
    assert raised.value.variable == CAP
    assert WINDOW in str(raised.value)
