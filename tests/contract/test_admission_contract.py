"""The admission of new turns (`store/lua/admission.lua`) against a real Redis: a table of cases.

Each case is a list of calls and what each must answer; the clock is a fake one the script
takes instead of the server's, so leases expire exactly when a case says.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis import Redis

from agent_runner.errors import DefinitionError
from store.keys import RedisKeys
from store.redis_admission import AdmissionDecision, RedisAdmission

pytestmark = pytest.mark.integration

T0 = 1_800_000_000.0


@dataclass
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Call:
    op: str
    """`enqueue`, `start`, `release` or `pump`."""
    turn: str = ""
    tenant: str | None = None
    admitted: tuple[str, ...] = ()
    """The turns this call must admit, in order."""
    place: int | None = None
    at: float = 0.0
    """Seconds after T0."""


def flood(tenant: str, count: int, admitted: int) -> list[Call]:
    """`count` turns of `tenant` enqueued one by one; the first `admitted` of them are admitted at once."""
    return [
        Call("enqueue", f"{tenant}{i}", tenant, admitted=(f"{tenant}{i}",) if i < admitted else ())
        for i in range(count)
    ]


@dataclass(frozen=True)
class Case:
    calls: list[Call]
    window: int = 2
    cap: int | None = None
    weights: dict[str, int] | None = None


CASES: dict[str, Case] = {
    "the window bounds the admitted turns that have not started": Case(
        [
            *flood("a", 4, admitted=2),
            Call("pump"),
            Call("start", "a0", "a", admitted=("a2",)),
            Call("start", "a1", "a", admitted=("a3",)),
        ]
    ),
    "a tenant alone gets the whole window (work conservation)": Case(flood("a", 5, admitted=5), window=5),
    "a newcomer goes before the crowd that waits": Case(
        [
            *flood("heavy", 6, admitted=2),
            Call("enqueue", "light0", "light", place=1),
            Call("start", "heavy0", "heavy", admitted=("light0",)),
            Call("start", "heavy1", "heavy", admitted=("heavy2",)),
        ]
    ),
    "several tenants interleave by weight": Case(
        [
            *flood("a", 6, admitted=1),
            *flood("b", 3, admitted=0),
            Call("start", "a0", "a", admitted=("b0",)),
            Call("start", "b0", "b", admitted=("a1",)),
            Call("start", "a1", "a", admitted=("a2",)),
            Call("start", "a2", "a", admitted=("b1",)),
            Call("start", "b1", "b", admitted=("a3",)),
            Call("start", "a3", "a", admitted=("a4",)),
        ],
        window=1,
        weights={"a": 2},
    ),
    "equal tenants alternate": Case(
        [
            *flood("a", 3, admitted=1),
            *flood("b", 3, admitted=0),
            Call("start", "a0", "a", admitted=("b0",)),
            Call("start", "b0", "b", admitted=("a1",)),
            Call("start", "a1", "a", admitted=("b1",)),
        ],
        window=1,
    ),
    "a tenant beside a flood is let in until it holds as many turns as the flood's tenant": Case(
        [
            *flood("a", 4, admitted=1),
            Call("start", "a0", "a", admitted=("a1",)),
            Call("start", "a1", "a", admitted=("a2",)),
            Call("start", "a2", "a", admitted=("a3",)),
            Call("enqueue", "a4", "a"),
            *flood("b", 3, admitted=0),
            # a holds 4 turns, b none: b's turns go first while it holds fewer
            Call("start", "a3", "a", admitted=("b0",)),
            Call("start", "b0", "b", admitted=("b1",)),
            Call("start", "b1", "b", admitted=("b2",)),
            Call("start", "b2", "b", admitted=("a4",)),
        ],
        window=1,
    ),
    "tenants holding as many turns for their weight take turns by start tag": Case(
        [
            *flood("a", 3, admitted=1),
            *flood("b", 3, admitted=0),
            Call("start", "a0", "a", admitted=("b0",)),
            Call("start", "b0", "b", admitted=("a1",)),
            Call("release", "a1", admitted=("b1",)),
            Call("start", "b1", "b", admitted=("a2",)),
        ],
        window=1,
    ),
    "an expired slot is given back to the next turn": Case(
        [
            *flood("a", 3, admitted=1),
            Call("pump", at=9.0),
            Call("pump", at=10.5, admitted=("a1",)),
        ],
        window=1,
    ),
    "a tenant at its cap waits while another uses the window": Case(
        [
            *flood("a", 3, admitted=1),
            Call("start", "a0", "a"),
            Call("enqueue", "b0", "b", admitted=("b0",)),
            Call("release", "a0", admitted=("a1",)),
        ],
        window=5,
        cap=1,
    ),
    "a tenant waiting for a person frees its place under the cap": Case(
        [
            *flood("a", 2, admitted=1),
            Call("start", "a0", "a"),
            Call("pump"),
            Call("release", "a0", admitted=("a1",)),
        ],
        window=5,
        cap=1,
    ),
    "a started turn past its active lease stops counting against the cap": Case(
        [
            *flood("a", 2, admitted=1),
            Call("start", "a0", "a"),
            Call("pump", at=99.0),
            Call("pump", at=100.5, admitted=("a1",)),
        ],
        window=5,
        cap=1,
    ),
    "a turn enqueued twice keeps its place": Case(
        [
            *flood("a", 3, admitted=1),
            Call("enqueue", "a2", "a", place=2),
            Call("enqueue", "a1", "a", place=1),
            Call("enqueue", "a0", "a"),
            Call("start", "a0", "a", admitted=("a1",)),
            Call("start", "a1", "a", admitted=("a2",)),
            Call("start", "a2", "a"),
        ],
        window=1,
    ),
    "a turn cancelled while it waits is never admitted": Case(
        [
            *flood("a", 3, admitted=1),
            Call("release", "a1"),
            Call("start", "a0", "a", admitted=("a2",)),
        ],
        window=1,
    ),
    "a started turn found READY again waits again": Case(
        [
            *flood("a", 1, admitted=1),
            Call("start", "a0", "a"),
            Call("enqueue", "a0", "a", admitted=("a0",)),
        ],
        window=1,
        cap=1,
    ),
}


@pytest.fixture
def make_admission(redis_url: str) -> Iterator[Callable[..., RedisAdmission]]:
    built: list[RedisAdmission] = []
    prefix = f"agent-runner-test-{uuid.uuid4().hex}"

    def make(**options: Any) -> RedisAdmission:
        options.setdefault("slot_lease_s", 10.0)
        options.setdefault("active_lease_s", 100.0)
        admission = RedisAdmission("q", redis_url, prefix=prefix, **options)
        built.append(admission)
        return admission

    yield make
    for admission in built:
        admission.close()
    client: Redis[Any] = Redis.from_url(redis_url)
    found = list(client.scan_iter(match=RedisKeys(prefix).pattern(), count=1000))
    if found:
        client.delete(*found)
    client.close()


def run(admission: RedisAdmission, call: Call) -> AdmissionDecision:
    if call.op == "enqueue":
        return admission.enqueue(call.turn, call.tenant)
    if call.op == "start":
        return admission.start(call.turn, call.tenant)
    if call.op == "release":
        return admission.release(call.turn)
    assert call.op == "pump"
    return admission.pump()


@pytest.mark.parametrize("name", list(CASES))
def test_admission_decides_as_the_table_says(make_admission: Callable[..., RedisAdmission], name: str) -> None:
    case = CASES[name]
    clock = Clock()
    admission = make_admission(
        window=case.window, tenant_max_in_flight=case.cap, tenant_weights=case.weights, clock=clock
    )
    for step, call in enumerate(case.calls):
        clock.now = T0 + call.at
        decision = run(admission, call)
        assert decision.admitted == call.admitted, f"call {step} {call}"
        if call.place is not None:
            assert decision.place == call.place, f"call {step} {call}"


def test_the_counts_of_a_tenant_are_reported(make_admission: Callable[..., RedisAdmission]) -> None:
    # Given a window of 2 and five turns of one tenant
    admission = make_admission(window=2)
    for i in range(4):
        admission.enqueue(f"a{i}", "a")
    # When the fifth waits
    decision = admission.enqueue("a4", "a")
    # Then it is third in line, three wait and two are admitted
    assert (decision.place, decision.tenant_waiting, decision.tenant_active, decision.tenant) == (3, 3, 2, "a")
    # And a release reports the counts of the released turn's tenant
    released = admission.release("a0")
    assert (released.admitted, released.tenant, released.tenant_waiting, released.tenant_active) == (
        ("a2",),
        "a",
        2,
        2,
    )


def test_lined_up_names_the_turns_that_wait_or_hold_a_slot(make_admission: Callable[..., RedisAdmission]) -> None:
    # Given a window of 1 and three turns, the first of which started
    admission = make_admission(window=1)
    admission.enqueue("a0", "a")
    admission.enqueue("a1", "a")
    admission.enqueue("a2", "a")
    admission.start("a0", "a")
    # Then a1 holds the freed slot and a2 waits; a0 has started, and "gone" is unknown
    assert admission.lined_up(["a0", "a1", "a2", "gone"]) == {"a1", "a2"}
    assert admission.lined_up([]) == set()


def test_heavy_weights_take_their_share_over_a_long_run(make_admission: Callable[..., RedisAdmission]) -> None:
    # Given two tenants with 60 turns each waiting, weighted 3 to 1, and a window of 1
    admission = make_admission(window=1, tenant_weights={"big": 3})
    order: list[str] = []
    for i in range(60):
        order += admission.enqueue(f"big{i}", "big").admitted
        order += admission.enqueue(f"small{i}", "small").admitted
    # When 40 turns start one after the other
    while len(order) < 40:
        order += admission.start(order[-1], order[-1].rstrip("0123456789")).admitted
    # Then 'big' got three of every four
    assert sum(turn.startswith("big") for turn in order[:40]) == 30


def test_nonsense_limits_are_refused(redis_url: str) -> None:
    with pytest.raises(DefinitionError, match="window"):
        RedisAdmission("q", redis_url, window=0)
    with pytest.raises(DefinitionError, match="in flight"):
        RedisAdmission("q", redis_url, window=1, tenant_max_in_flight=0)
    with pytest.raises(DefinitionError, match="weight"):
        RedisAdmission("q", redis_url, window=1, tenant_weights={"a": 0})
