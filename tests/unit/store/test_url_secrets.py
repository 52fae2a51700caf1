"""Passwords with unencoded URL delimiters: masked whole in messages, refused by the stores without being shown."""

from __future__ import annotations

import pytest

import store
from agent_runner import StoreError
from tests.helpers.hostile import UNENCODED_PASSWORD, UNENCODED_URLS, assert_no_password_piece


@pytest.mark.parametrize("url", UNENCODED_URLS)
def test_masking_a_url_whose_password_holds_delimiters_shows_none_of_it(url: str) -> None:
    from store.redaction import mask_url_secrets, redact_url, url_secrets

    for shown in (redact_url(url), mask_url_secrets(url), mask_url_secrets(f"connecting to {url} failed")):
        assert_no_password_piece(shown)
        assert "***" in shown
    assert UNENCODED_PASSWORD in url_secrets(url)


def test_stores_refuse_a_password_with_unencoded_delimiters_and_show_none_of_it() -> None:
    with pytest.raises(StoreError, match="percent-encode") as refused:
        store.make_engine(UNENCODED_URLS[0])
    assert_no_password_piece(str(refused.value))
    with pytest.raises(ValueError, match="percent-encode") as refused_redis:
        store.RedisTurnLease(UNENCODED_URLS[1])
    assert_no_password_piece(str(refused_redis.value))
    # A percent-encoded password is accepted
    store.make_engine("postgresql+psycopg://app:Kq%40Zx%3FWv%23Yj%2FTm42@db.internal:5432/agents").dispose()
