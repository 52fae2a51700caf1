"""The fake provider server every adapter test points its SDK at, and models closed before it stops."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.helpers.fake_openai import FakeChatServer

M = TypeVar("M")


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    fake = FakeChatServer()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def closing(server: FakeChatServer) -> Iterator[Callable[[M], M]]:
    """Keep a model to close after the test, before the server stops (no connection outlives a test)."""
    models: list[Any] = []

    def keep(model: M) -> M:
        models.append(model)
        return model

    yield keep
    for model in models:
        model.close()
