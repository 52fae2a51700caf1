"""The `ModelLimiter` contract: one table of cases walked against the in-process limiter and the Redis one.

Time is a fake clock shared by the test and the limiter (the Redis scripts take it instead
of the server clock), so every slot is checked to the millisecond.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from redis import Redis

from agent_runner.model_limits import (
    InProcessModelLimiter,
    LimitGrant,
    LimitReason,
    LimitWait,
    ModelLimit,
    ModelLimiter,
)
from store.keys import RedisKeys
from store.redis_limits import RedisModelLimiter

T0 = 1_800_000_000.0
KEY = "openai:gpt-test"


@dataclass
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Acquire:
    at: float
    name: str
    expect: str | tuple[float, LimitReason]
    """`"grant"`, or `(seconds after T0 of the slot, reason)`."""
    tokens: int = 1
    claim: bool = False
    """Hand back the booking `name` got earlier."""
    tenant: str | None = None


@dataclass(frozen=True)
class Settle:
    at: float
    name: str
    actual: int | None


@dataclass(frozen=True)
class Pause:
    at: float
    until: float


Step = Acquire | Settle | Pause

CASES: dict[str, tuple[ModelLimit, list[Step]]] = {
    "rpm is spread one request per interval, and a crowd is booked one slot apart": (
        ModelLimit(rpm=60),
        [
            Acquire(0, "a", "grant"),
            Acquire(0, "b", (1.0, LimitReason.RPM)),
            Acquire(0, "c", (2.0, LimitReason.RPM)),
            Acquire(0.2, "d", (3.0, LimitReason.RPM)),
            Acquire(1.0, "b", "grant", claim=True),
            Acquire(2.0, "c", "grant", claim=True),
            Acquire(3.0, "d", "grant", claim=True),
            Acquire(3.5, "e", (4.0, LimitReason.RPM)),
            Acquire(10.0, "f", "grant"),
        ],
    ),
    "a burst goes at once after a quiet spell, then the rate holds": (
        ModelLimit(rpm=60, burst=3),
        [
            Acquire(0, "a", "grant"),
            Acquire(0, "b", "grant"),
            Acquire(0, "c", "grant"),
            Acquire(0, "d", (1.0, LimitReason.RPM)),
            Acquire(0.5, "e", (2.0, LimitReason.RPM)),
            Acquire(1.0, "d", "grant", claim=True),
            Acquire(2.0, "e", "grant", claim=True),
        ],
    ),
    "a booking claimed before its slot waits for it, and one claimed too late is booked again": (
        ModelLimit(rpm=60),
        [
            Acquire(0, "a", "grant"),
            Acquire(0, "b", (1.0, LimitReason.RPM)),
            Acquire(0.5, "b", (1.0, LimitReason.SLOT), claim=True),
            Acquire(100.0, "b", "grant", claim=True),  # the grace (60 s) passed: a fresh request, granted
        ],
    ),
    "a booked call that came back late pushes the next one back, so sends never bunch": (
        ModelLimit(rpm=60),
        [
            Acquire(0, "a", "grant"),
            Acquire(0, "b", (1.0, LimitReason.RPM)),
            Acquire(0, "c", (2.0, LimitReason.RPM)),
            Acquire(1.9, "b", "grant", claim=True),
            Acquire(2.0, "c", (2.9, LimitReason.SLOT), claim=True),
            Acquire(2.9, "c", "grant", claim=True),
            Acquire(2.9, "d", (3.9, LimitReason.RPM)),
        ],
    ),
    "a tenant arriving behind another's crowd gets every other slot, not the end of the queue": (
        ModelLimit(rpm=60),
        [
            Acquire(0, "a1", "grant", tenant="a"),
            Acquire(0, "a2", (1.0, LimitReason.RPM), tenant="a"),
            Acquire(0, "a3", (2.0, LimitReason.RPM), tenant="a"),
            Acquire(0, "a4", (3.0, LimitReason.RPM), tenant="a"),
            Acquire(0.1, "b1", (2.0, LimitReason.RPM), tenant="b"),  # a3 and a4 move one slot later
            Acquire(0.1, "b2", (4.0, LimitReason.RPM), tenant="b"),  # its share: every other slot
            Acquire(1.0, "a2", "grant", tenant="a", claim=True),
            Acquire(2.0, "a3", (3.0, LimitReason.SLOT), tenant="a", claim=True),  # told where it moved
            Acquire(2.0, "b1", "grant", tenant="b", claim=True),
            Acquire(3.0, "a3", "grant", tenant="a", claim=True),
            Acquire(4.0, "b2", "grant", tenant="b", claim=True),
            Acquire(5.0, "a4", "grant", tenant="a", claim=True),
            Acquire(5.0, "a5", (6.0, LimitReason.RPM), tenant="a"),  # alone again: every slot
        ],
    ),
    "tenants whose calls alternate share the slots with none left unused": (
        ModelLimit(rpm=60),
        [
            Acquire(0, "a1", "grant", tenant="a"),
            Acquire(0, "b1", (1.0, LimitReason.RPM), tenant="b"),
            Acquire(0, "a2", (2.0, LimitReason.RPM), tenant="a"),
            Acquire(0, "b2", (3.0, LimitReason.RPM), tenant="b"),
            Acquire(0, "a3", (4.0, LimitReason.RPM), tenant="a"),
            Acquire(0, "b3", (5.0, LimitReason.RPM), tenant="b"),
        ],
    ),
    "tenants share by weight: one weighing 4 gets four slots to the other's one": (
        ModelLimit(rpm=60),
        [
            Acquire(0, "a1", "grant", tenant="a"),
            Acquire(0, "a2", (1.0, LimitReason.RPM), tenant="a"),
            Acquire(0, "a3", (2.0, LimitReason.RPM), tenant="a"),
            Acquire(0.1, "h1", (1.0, LimitReason.RPM), tenant="heavy"),
            Acquire(0.1, "h2", (2.0, LimitReason.RPM), tenant="heavy"),
            Acquire(0.1, "h3", (3.0, LimitReason.RPM), tenant="heavy"),
            Acquire(0.1, "h4", (5.0, LimitReason.RPM), tenant="heavy"),
            Acquire(0.5, "a2", (4.0, LimitReason.SLOT), tenant="a", claim=True),
            Acquire(0.5, "a3", (6.0, LimitReason.SLOT), tenant="a", claim=True),
        ],
    ),
    "tpm reserves the estimate, and settling refunds what was not used": (
        ModelLimit(tpm=6000),  # 100 tokens a second (10 ms each), room for 1000 at once
        [
            Acquire(0, "a", "grant", tokens=1000),
            Acquire(0, "b", (5.0, LimitReason.TPM), tokens=500),
            Settle(0.1, "a", 200),  # 800 tokens come back: the allowance is free again at 15 - 8 s
            Acquire(0.1, "c", (7.0, LimitReason.TPM), tokens=1000),
        ],
    ),
    "tpm counts what a call really used when it used more than reserved": (
        ModelLimit(tpm=6000),
        [
            Acquire(0, "a", "grant", tokens=1000),
            Settle(0.1, "a", 3000),
            Acquire(2.0, "b", (30.0, LimitReason.TPM), tokens=1000),
        ],
    ),
    "concurrency holds slots until settled, and a crashed caller's slot expires": (
        ModelLimit(concurrency=2),
        [
            Acquire(0, "a", "grant"),
            Acquire(0, "b", "grant"),
            Acquire(0, "c", (0.5, LimitReason.CONCURRENCY)),
            Settle(0.2, "a", None),
            Acquire(0.3, "c", "grant"),
            Acquire(0.4, "d", (0.9, LimitReason.CONCURRENCY)),
            Acquire(10.5, "d", "grant"),  # b never settled: its 10 s lease ran out
        ],
    ),
    "a pause stops every call until it ends, then the rate restarts from there": (
        ModelLimit(rpm=60),
        [
            Acquire(0, "a", "grant"),
            Pause(0.1, until=5.0),
            Acquire(0.2, "b", (5.0, LimitReason.PAUSED)),
            Acquire(0.3, "c", (6.0, LimitReason.RPM)),
            Acquire(5.0, "b", "grant", claim=True),
            Acquire(6.0, "c", "grant", claim=True),
        ],
    ),
    "a booked call waits out a pause that came after its booking": (
        ModelLimit(rpm=60),
        [
            Acquire(0, "a", "grant"),
            Acquire(0, "b", (1.0, LimitReason.RPM)),
            Pause(0.5, until=3.0),
            Acquire(1.0, "b", (3.0, LimitReason.PAUSED), claim=True),
            Acquire(3.0, "b", "grant", claim=True),
        ],
    ),
}


@pytest.fixture(params=["in-process", pytest.param("redis", marks=pytest.mark.integration)])
def make_limiter(request: pytest.FixtureRequest) -> Iterator[Any]:
    built: list[Any] = []
    prefix = f"agent-runner-test-{uuid.uuid4().hex}"

    def make(limits: dict[str, ModelLimit], clock: Clock) -> ModelLimiter:
        options: dict[str, Any] = {
            "call_lease_s": 10.0,
            "booking_grace_s": 60.0,
            "concurrency_poll_s": 0.5,
            "tenant_weights": {"heavy": 4},
        }
        if request.param == "in-process":
            return InProcessModelLimiter(limits, clock=clock, **options)
        url = str(request.getfixturevalue("redis_url"))
        limiter = RedisModelLimiter(limits, url, prefix=prefix, clock=clock, **options)
        built.append(limiter)
        return limiter

    yield make
    for limiter in built:
        limiter.close()
    if request.param == "redis":
        client: Redis[Any] = Redis.from_url(str(request.getfixturevalue("redis_url")))
        found = list(client.scan_iter(match=RedisKeys(prefix).pattern(), count=1000))
        if found:
            client.delete(*found)
        client.close()


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, UTC)


@pytest.mark.parametrize("case", list(CASES))
def test_the_limiter_decides_as_the_table_says(make_limiter: Any, case: str) -> None:
    limit, steps = CASES[case]
    clock = Clock()
    limiter: ModelLimiter = make_limiter({KEY: limit}, clock)
    grants: dict[str, LimitGrant] = {}
    bookings: dict[str, str | None] = {}
    for number, step in enumerate(steps):
        clock.now = T0 + step.at
        where = f"step {number} of {case!r}: {step}"
        match step:
            case Acquire():
                booking = bookings.get(step.name) if step.claim else None
                answer = limiter.acquire(KEY, step.tokens, f"{step.name}-{number}", booking, step.tenant)
                if isinstance(step.expect, str):
                    assert isinstance(answer, LimitGrant), where
                    grants[step.name] = answer
                else:
                    slot, reason = step.expect
                    assert isinstance(answer, LimitWait), where
                    assert (answer.reason, answer.until) == (reason, at(slot)), where
                    if answer.booking_id is not None:
                        bookings[step.name] = answer.booking_id
            case Settle():
                limiter.settle(grants[step.name], step.actual)
            case Pause():
                limiter.pause(KEY, at(step.until))


def test_a_key_without_limits_is_always_granted(make_limiter: Any) -> None:
    limiter: ModelLimiter = make_limiter({KEY: ModelLimit(rpm=1)}, Clock())
    answers = [limiter.acquire("openai:other", 10, f"r{n}") for n in range(5)]
    assert all(isinstance(answer, LimitGrant) for answer in answers)
    assert limiter.limit_for("openai:other") is None and limiter.limit_for(KEY) == ModelLimit(rpm=1)


def test_two_limiters_on_one_state_share_the_limit(make_limiter: Any) -> None:
    # Given two limiters (two processes) over the same state
    clock = Clock()
    first: ModelLimiter = make_limiter({KEY: ModelLimit(rpm=60)}, clock)
    second = first if isinstance(first, InProcessModelLimiter) else make_limiter({KEY: ModelLimit(rpm=60)}, clock)
    # When both ask at once, then only one is granted and the other is booked the next slot
    assert isinstance(first.acquire(KEY, 1, "a"), LimitGrant)
    answer = second.acquire(KEY, 1, "b")
    assert isinstance(answer, LimitWait) and answer.until == at(1.0)


@pytest.mark.integration
@pytest.mark.parametrize("seed", range(6))
def test_the_redis_scripts_decide_as_the_in_process_limiter_on_random_sequences(redis_url: str, seed: int) -> None:
    # Given both limiters on one fake clock, with limits whose times are whole milliseconds
    limits = {KEY: ModelLimit(rpm=120, tpm=6000, concurrency=3)}
    options: dict[str, Any] = {
        "call_lease_s": 4.0,
        "booking_grace_s": 3.0,
        "concurrency_poll_s": 0.5,
        "tenant_weights": {"a": 1, "b": 3, "c": 4},
    }
    clock = Clock()
    prefix = f"agent-runner-test-{uuid.uuid4().hex}"
    in_process = InProcessModelLimiter(limits, clock=clock, **options)
    redis_limiter = RedisModelLimiter(limits, redis_url, prefix=prefix, clock=clock, **options)
    rng = random.Random(seed)
    grants: list[tuple[LimitGrant, LimitGrant]] = []
    bookings: list[tuple[str | None, str | None]] = []
    try:
        for number in range(150):
            clock.now += rng.choice([0, 0, 0.01, 0.1, 0.25, 0.5, 1.0, 2.5])
            roll = rng.random()
            if roll < 0.55:
                tokens = rng.choice([1, 50, 200, 900])
                held = rng.choice(bookings) if bookings and rng.random() < 0.5 else (None, None)
                tenant = rng.choice([None, "a", "b", "c"])
                answers = (
                    in_process.acquire(KEY, tokens, f"r{number}", held[0], tenant),
                    redis_limiter.acquire(KEY, tokens, f"r{number}", held[1], tenant),
                )
                assert _shape(answers[0]) == _shape(answers[1]), f"step {number}"
                if isinstance(answers[0], LimitGrant) and isinstance(answers[1], LimitGrant):
                    grants.append((answers[0], answers[1]))
                elif isinstance(answers[0], LimitWait) and isinstance(answers[1], LimitWait):
                    bookings.append((answers[0].booking_id, answers[1].booking_id))
            elif roll < 0.85 and grants:
                pair = grants.pop(rng.randrange(len(grants)))
                actual = rng.choice([None, 0, 30, 500])
                in_process.settle(pair[0], actual)
                redis_limiter.settle(pair[1], actual)
            else:
                until = at(clock.now - T0 + rng.choice([0.5, 1.0, 3.0]))
                in_process.pause(KEY, until)
                redis_limiter.pause(KEY, until)
    finally:
        redis_limiter.close()
        client: Redis[Any] = Redis.from_url(redis_url)
        found = list(client.scan_iter(match=RedisKeys(prefix).pattern(), count=1000))
        if found:
            client.delete(*found)
        client.close()


def _shape(answer: LimitGrant | LimitWait) -> tuple[Any, ...]:
    if isinstance(answer, LimitGrant):
        return ("grant", answer.tokens)
    # Times to the millisecond: the scripts keep them with three decimals
    return ("wait", answer.reason, round(answer.until.timestamp() * 1000), answer.booking_id is not None)
