"""Shared test configuration: service URLs come from the environment (see DESIGN section 6)."""

from __future__ import annotations

import os

import pytest

TEST_DATABASE_URL = os.environ.get(
    "AGENT_RUNNER_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
TEST_REDIS_URL = os.environ.get("AGENT_RUNNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(autouse=True)
def _no_real_model_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests never talk to a hosted model: an accidental real call fails for lack of a key.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
