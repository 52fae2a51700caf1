"""Malformed service URLs in the worker settings: refused with the variable named, the password never shown."""

from __future__ import annotations

import pytest

from tests.helpers.hostile import UNENCODED_URLS, assert_no_password_piece
from workers.settings import SettingsError, WorkerSettings


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENT_RUNNER_DATABASE_URL", "postgresql+psycopg//user:s3cret-pw@db/agent"),
        ("AGENT_RUNNER_DATABASE_URL", "postgres:/user:s3cret-pw@db/agent"),
        ("AGENT_RUNNER_DATABASE_URL", "user:s3cret-pw@db:5432/agent"),
        ("AGENT_RUNNER_DATABASE_URL", "postgresql://user:s3cret-pw@db:port/agent"),
        ("AGENT_RUNNER_REDIS_URL", "redis:/x:s3cret-pw@h"),
        ("AGENT_RUNNER_REDIS_URL", "redis//:s3cret-pw@h:6379/0"),
        ("AGENT_RUNNER_REDIS_URL", "redis://:s3cret-pw@h:99999/0"),
        ("CELERY_BROKER_URL", "amqp//guest:s3cret-pw@rabbit//"),
        ("CELERY_BROKER_URL", "amqp:guest:s3cret-pw@rabbit"),
    ],
)
def test_settings_errors_never_show_a_password(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        WorkerSettings.from_env({variable: value})
    assert caught.value.variable == variable
    assert "s3cret-pw" not in str(caught.value) and "s3cret-pw" not in repr(caught.value.value)
    assert "***" in str(caught.value)


def test_settings_mask_a_password_holding_an_at_sign() -> None:
    with pytest.raises(SettingsError) as caught:
        WorkerSettings.from_env({"AGENT_RUNNER_DATABASE_URL": "postgres:/user:pa@ss:w/rd@db/agent"})
    assert "pa@ss" not in str(caught.value) and "w/rd" not in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("AGENT_RUNNER_DATABASE_URL", UNENCODED_URLS[0]),
        ("AGENT_RUNNER_REDIS_URL", UNENCODED_URLS[1]),
        ("CELERY_BROKER_URL", UNENCODED_URLS[3]),
    ],
)
def test_settings_refuse_a_password_with_unencoded_delimiters_and_show_none_of_it(variable: str, url: str) -> None:
    with pytest.raises(SettingsError, match="percent-encode") as caught:
        WorkerSettings.from_env({variable: url})
    assert_no_password_piece(str(caught.value))
