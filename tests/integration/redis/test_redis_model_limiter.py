"""The Redis model limiter on the server's own clock, its keys, and a Redis that cannot be reached."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis import Redis

from agent_runner import Agent, AgentRunner, AgentTurnStatus, AiMessage, ModelLimit, ScriptedChatModel
from agent_runner.errors import StoreUnavailableError
from agent_runner.model_limits import LimitGrant, LimitReason, LimitWait
from store.keys import RedisKeys
from store.redis_limits import RedisModelLimiter

pytestmark = pytest.mark.integration

KEY = "openai:gpt-test"


@pytest.fixture
def limiter(redis_url: str, keys: RedisKeys) -> Iterator[RedisModelLimiter]:
    with RedisModelLimiter({KEY: ModelLimit(rpm=600, concurrency=5)}, redis_url, prefix=keys.prefix) as built:
        yield built


def test_decisions_use_the_server_clock_and_spread_requests(limiter: RedisModelLimiter) -> None:
    # Given a limit of ten requests a second, when three calls ask at once
    asked = datetime.now(UTC)
    first, second, third = (limiter.acquire(KEY, 10, f"r{n}") for n in range(3))
    # Then one goes and the others are booked 100 ms apart, on the server's clock
    assert isinstance(first, LimitGrant)
    assert isinstance(second, LimitWait) and isinstance(third, LimitWait)
    assert (second.reason, third.reason) == (LimitReason.RPM, LimitReason.RPM)
    # (each wait is carried over to this process's clock when its answer arrives)
    assert abs(third.until - second.until - timedelta(milliseconds=100)) < timedelta(milliseconds=30)
    assert abs(second.until - (asked + timedelta(milliseconds=100))) < timedelta(seconds=1)


def test_every_key_is_in_the_namespace_and_expires(
    limiter: RedisModelLimiter, keys: RedisKeys, redis_client: Redis[Any]
) -> None:
    grant = limiter.acquire(KEY, 10, "r1")
    limiter.acquire(KEY, 10, "r2")
    assert isinstance(grant, LimitGrant)
    limiter.pause(KEY, datetime.now(UTC) + timedelta(seconds=5))
    found = sorted(key.decode() for key in redis_client.scan_iter(match=keys.pattern()))
    assert found == sorted(keys.model_limit(KEY))
    assert all(0 < redis_client.pttl(key) <= 10 * 60 * 1000 for key in found)
    # Settling frees the concurrency slot
    limiter.settle(grant, None)
    assert redis_client.zcard(keys.model_limit(KEY)[1]) == 0


def test_an_unreachable_redis_makes_the_call_wait_and_never_sends_it() -> None:
    # Given a limiter whose Redis does not answer (nothing listens on port 1)
    with RedisModelLimiter({KEY: ModelLimit(rpm=60)}, "redis://127.0.0.1:1/0") as unreachable:
        with pytest.raises(StoreUnavailableError):
            unreachable.acquire(KEY, 10, "r1")
        model = ScriptedChatModel(lambda request: AiMessage("done"), rate_limit_key=KEY)
        runner = AgentRunner(model_limiter=unreachable)
        # When a turn calls the model, then it waits and asks again later; the model was not called
        turn = runner.run(Agent(id="limited", chat_model=model), "hi")
    assert turn.status is AgentTurnStatus.RETRY_SCHEDULED and turn.attempt == 0 and model.calls == 0
    assert turn.suspension is not None and turn.suspension.metadata["limit_reason"] == "unavailable"
