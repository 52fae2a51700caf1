"""Token signing (`workers.api.tokens`): what verifies, what does not, and the secret's setting."""

from __future__ import annotations

import pytest

from workers.api.server_settings import ApiSettings
from workers.api.tokens import InvalidTokenError, issue_token, parse_secret, verify_token
from workers.settings import SettingsError

SECRET = b"s" * 32


def test_a_token_verifies_with_its_secret_until_it_expires() -> None:
    token, claims = issue_token(SECRET, tenant="acme", user="u-1", conversation_id="c-1", ttl_s=60, now=1000)
    assert verify_token(SECRET, token, now=1059) == claims
    assert (claims.tenant, claims.user, claims.conversation_id, claims.expires_at) == ("acme", "u-1", "c-1", 1060)
    with pytest.raises(InvalidTokenError, match="expired"):
        verify_token(SECRET, token, now=1060)
    with pytest.raises(InvalidTokenError, match="not valid"):
        verify_token(b"t" * 32, token, now=1000)
    with pytest.raises(InvalidTokenError, match="accepts no tokens"):
        verify_token(None, token, now=1000)


def test_the_secret_is_read_from_the_environment_and_must_be_long() -> None:
    assert parse_secret(None) is None and parse_secret(" ") is None
    assert ApiSettings.from_env({"AGENT_RUNNER_TOKEN_SECRET": "k" * 32}).token_secret == b"k" * 32
    with pytest.raises(SettingsError, match="AGENT_RUNNER_TOKEN_SECRET") as caught:
        ApiSettings.from_env({"AGENT_RUNNER_TOKEN_SECRET": "short-secret"})
    assert "short-secret" not in str(caught.value)
    assert "k" * 32 not in repr(ApiSettings.from_env({"AGENT_RUNNER_TOKEN_SECRET": "k" * 32}))
