"""Origins of `AGENT_RUNNER_CORS_ORIGINS` and `create_app(cors_origins=...)`: parsed strictly, `*` refused with keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.api import ApiKeys, ApiSettings, create_app
from workers.api.cors import parse_origins
from workers.settings import SettingsError


def test_origins_are_parsed_trimmed_and_deduplicated() -> None:
    value = " https://app.example.com, http://localhost:5173 ,,https://app.example.com"
    assert parse_origins(value) == ("https://app.example.com", "http://localhost:5173")
    assert parse_origins(None) == () and parse_origins("  ") == ()
    assert parse_origins("*") == ("*",)


@pytest.mark.parametrize(
    "origin", ["https://app.example.com/", "https://app.example.com/path", "ftp://files", "localhost:5173", "http://"]
)
def test_what_is_not_an_origin_is_refused_naming_it(origin: str) -> None:
    with pytest.raises(SettingsError, match="AGENT_RUNNER_CORS_ORIGINS") as caught:
        parse_origins(f"https://ok.example.com,{origin}")
    assert repr(origin) in str(caught.value)


def test_any_origin_is_refused_when_keys_are_set_from_the_environment_and_the_argument(tmp_path: Path) -> None:
    env = {"AGENT_RUNNER_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}", "AGENT_RUNNER_API_KEYS": "acme:k-123456"}
    with pytest.raises(SettingsError, match="lets every web site"):
        ApiSettings.from_env({**env, "AGENT_RUNNER_CORS_ORIGINS": "https://ok.example.com,*"})
    with pytest.raises(SettingsError, match="lets every web site"):
        create_app(environ=env, agents=None, cors_origins=["*"])
    # Without keys a single-tenant server may allow any origin.
    assert ApiSettings.from_env(
        {**env, "AGENT_RUNNER_API_KEYS": "", "AGENT_RUNNER_CORS_ORIGINS": "*"}
    ).cors_origins == ("*",)
    settings = ApiSettings(keys=ApiKeys.parse("acme:k-123456"), cors_origins=("https://ok.example.com",))
    assert create_app(settings, cors_origins="http://localhost:5173").state.settings.cors_origins == (
        "http://localhost:5173",
    )
