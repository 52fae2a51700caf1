"""Shared limits of a model provider account: requests and tokens per minute, concurrent calls.

Not to be confused with `agent_runner.limits`, which bounds the size of caller input.

Every model adapter names the key its calls count against (`rate_limit_key`, by default
`"<provider>:<model>"`). A `ModelLimiter` decides, before each call, whether the call may
go now; when it may not, the turn waits as RETRY_SCHEDULED until the limiter's answer,
without using a retry attempt and without holding a thread. Every process that shares the
limiter's state (the deployment's Redis, or one process's memory) shares the limit.

How each limit is kept (times in milliseconds since the epoch):

- `rpm`: a generic cell rate algorithm (GCRA) over the requests really sent. Requests are
  spread evenly, one every `60 s / rpm`, with `burst` requests allowed at once after a quiet
  spell (default 1: no burst, so no window shorter than a minute sees more than its share).
  A call that finds no slot is given the next free one and keeps it (a *booking*): a crowd
  of waiting turns is queued one slot apart instead of returning all at once. A booked call
  that comes back late is checked against the rate again, so lateness never bunches sends.
- `tpm`: the same algorithm counted in tokens, with room for ten seconds' worth at once. A
  call reserves its estimated input tokens plus its output allowance (`max_tokens`, or
  `ModelLimiter.default_output_tokens`); when it returns, the reservation is settled with the
  usage the provider reported.
- `concurrency`: each granted call holds a slot that expires after `call_lease_s`, so a
  crashed worker's slot comes back by itself.
- `pause`: a provider's 429 with a Retry-After pauses the key for everyone until then.
- tenants: while several tenants have calls queued on a key, its slots are shared by their
  weights (start-time fair queueing, see `_book`); a tenant alone gets every slot, so no
  capacity is left unused.
"""

from __future__ import annotations

import json
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Protocol, TypedDict, Unpack

from agent_runner.errors import DefinitionError

PERIOD_MS: Final = 60_000.0
"""The period of `rpm` and `tpm`: one minute."""
DEFAULT_CALL_LEASE_S: Final = 300.0
"""How long a granted call holds its concurrency slot unless it is settled first."""
DEFAULT_BOOKING_GRACE_S: Final = 60.0
"""How long after its slot a booking may still be claimed; later, the slot is lost and booked again."""
DEFAULT_CONCURRENCY_POLL_S: Final = 0.5
"""How long a call that found every concurrent slot taken waits before it asks again."""
DEFAULT_OUTPUT_TOKENS: Final = 1024
"""Output tokens reserved for a call whose model sets no `max_tokens`."""
WAIT_OVER_REASON: Final = "model limit wait over"
"""`reason` of the TURN_RESUMED event of a turn whose wait for a model limit is over."""
LIMIT_FIELDS: Final = ("rpm", "tpm", "concurrency")
"""The fields of one entry of `AGENT_RUNNER_MODEL_LIMITS`."""


@dataclass(frozen=True)
class ModelLimit:
    """The limits of one key; None leaves that dimension unlimited.

    Attributes:
        rpm: Requests per minute, spread evenly.
        tpm: Tokens per minute (input and output).
        concurrency: Calls in flight at once.
        burst: Requests that may go at once after a quiet spell (1: strictly spread). Set
            it in code only; a provider that checks its per-minute limit over a second
            answers a burst above `rpm / 60` with 429.
    """

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    burst: int = 1

    def __post_init__(self) -> None:
        for name in (*LIMIT_FIELDS, "burst"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise DefinitionError(f"model limit {name} must be an integer, got {value!r}")
            if value <= 0:
                raise DefinitionError(f"model limit {name} must be greater than zero, got {value!r}")
        if self.rpm is not None and self.burst > self.rpm:
            raise DefinitionError(f"model limit burst ({self.burst}) must not exceed rpm ({self.rpm})")

    @property
    def request_interval_ms(self) -> float:
        """Milliseconds between two requests at the `rpm` rate (0 when unlimited)."""
        return PERIOD_MS / self.rpm if self.rpm else 0.0

    @property
    def token_interval_ms(self) -> float:
        """Milliseconds one token takes at the `tpm` rate (0 when unlimited)."""
        return PERIOD_MS / self.tpm if self.tpm else 0.0

    @property
    def token_room(self) -> float:
        """Tokens that may go at once: ten seconds' worth of `tpm`, so one large call on an idle key goes at once."""
        return self.tpm / 6 if self.tpm else 0.0


def parse_model_limits(text: str) -> dict[str, ModelLimit]:
    """Read the JSON of `AGENT_RUNNER_MODEL_LIMITS`: `{"<key>": {"rpm": 500, "tpm": 200000, "concurrency": 20}}`.

    Raises:
        DefinitionError: Not JSON, not an object of objects, an unknown field, a value
            that is not a whole number, or a limit that is not above zero.
    """
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise DefinitionError(f"expected a JSON object: {exc}") from None
    if not isinstance(parsed, dict):
        raise DefinitionError(f'expected a JSON object {{"<key>": {{"rpm": n, ...}}}}, got {type(parsed).__name__}')
    limits: dict[str, ModelLimit] = {}
    for key, entry in parsed.items():
        if not key:
            raise DefinitionError("a limit key must not be empty")
        if not isinstance(entry, dict):
            raise DefinitionError(f"the limits of {key!r} must be an object, got {type(entry).__name__}")
        unknown = sorted(set(entry) - set(LIMIT_FIELDS))
        if unknown:
            raise DefinitionError(f"the limits of {key!r} name unknown fields {unknown}; known: {list(LIMIT_FIELDS)}")
        try:
            limits[key] = ModelLimit(**entry)
        except DefinitionError as exc:
            raise DefinitionError(f"the limits of {key!r}: {exc}") from None
    return limits


def check_weights(weights: Mapping[str, int]) -> dict[str, int]:
    """Tenant weights as given, checked: whole numbers above zero (a tenant not named weighs 1).

    Raises:
        DefinitionError: A weight that is not a whole number above zero.
    """
    for tenant, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
            raise DefinitionError(f"the weight of tenant {tenant!r} must be a whole number above zero, got {weight!r}")
    return dict(weights)


class LimitReason(StrEnum):
    """Why a model call waits."""

    RPM = "rpm"
    """The requests-per-minute rate: the call was given a later slot."""
    TPM = "tpm"
    """The tokens-per-minute rate: the call was given a later slot."""
    CONCURRENCY = "concurrency"
    """Every concurrent slot is taken."""
    PAUSED = "paused"
    """The provider asked everyone to wait (a 429 with Retry-After)."""
    SLOT = "slot"
    """The call came back before the slot it holds."""
    PROVIDER = "provider"
    """This call was answered 429 by the provider; the key is paused."""
    UNAVAILABLE = "unavailable"
    """The limiter's state could not be reached; nothing is sent past the limit meanwhile."""


@dataclass(frozen=True)
class LimitGrant:
    """Leave to make one call now; settle it when the call returns (or fails)."""

    key: str
    reservation_id: str
    tokens: int
    """The tokens reserved (estimated input plus the output allowance)."""


@dataclass(frozen=True)
class LimitWait:
    """No capacity now: ask again at `until`, passing `booking_id` back when there is one."""

    key: str
    until: datetime
    reason: LimitReason
    booking_id: str | None = None
    """The slot kept for this call at `until`; `acquire` honours it until the booking grace ends."""


class ModelLimiter(Protocol):
    """Decides when a call against a limit key may go; shared by every process that shares its state."""

    default_output_tokens: int
    """Output tokens reserved for a call whose model sets no `max_tokens`."""

    def limit_for(self, key: str) -> ModelLimit | None:
        """The limits of `key`, or None when calls against it are not limited."""

    def acquire(
        self,
        key: str,
        estimated_tokens: int,
        reservation_id: str,
        booking_id: str | None = None,
        tenant: str | None = None,
    ) -> LimitGrant | LimitWait:
        """Grant a call now, or say until when there is no capacity.

        `tenant`: whose call it is; tenants with calls queued share the key by their weights.

        Raises:
            StoreUnavailableError: The shared state could not be reached (retry later; never call meanwhile).
        """

    def settle(self, grant: LimitGrant, actual_tokens: int | None) -> None:
        """The call is over: count `actual_tokens` instead of the reservation (None: keep it) and free its slot."""

    def release(self, grant: LimitGrant) -> None:
        """The call is over without a usage report: free its slot and keep the reservation."""

    def pause(self, key: str, until: datetime) -> None:
        """No call against `key` may go before `until` (the provider said so), in any process."""


# --- The decision, shared by the in-process limiter (the Lua scripts of store/ mirror it) -------


@dataclass
class KeyState:
    """What the limiter remembers of one key (milliseconds since the epoch)."""

    rpm_tat: float = 0.0
    """When the next request is theoretically due (GCRA over the requests really sent)."""
    tpm_tat: float = 0.0
    """When the token allowance is theoretically back to empty (GCRA counted in tokens)."""
    paused_until: float = 0.0
    calls: dict[str, float] = field(default_factory=dict)
    """Concurrency slots: reservation id -> expiry."""
    bookings: dict[str, float] = field(default_factory=dict)
    """Slots given to waiting calls: booking id -> slot time."""
    tags: dict[str, float] = field(default_factory=dict)
    """The place of each booking in the fair order of tenants: booking id -> virtual tag."""
    lanes: dict[str, float] = field(default_factory=dict)
    """Per tenant: the tag of its last booking."""
    vtime: float = 0.0
    """The virtual time: the greatest tag of a booking taken so far."""


@dataclass(frozen=True)
class Decision:
    """The answer of `decide`: granted, or the slot time and why."""

    granted: bool
    until_ms: float = 0.0
    reason: LimitReason | None = None
    booking_id: str | None = None


@dataclass(frozen=True)
class LimitedCall:
    """One call asking for capacity against a limited key."""

    key: str
    tokens: int
    """The tokens it reserves (estimated input plus the output allowance)."""
    reservation_id: str
    booking_id: str | None
    lane: str
    """Its tenant (`""` for none): tenants with calls queued share the key by their weights."""
    weight: int


def decide(
    state: KeyState,
    limit: ModelLimit,
    now: float,
    call: LimitedCall,
    *,
    lease_ms: float,
    grace_ms: float,
    poll_ms: float,
) -> Decision:
    """Grant a call or book it a slot, updating `state` (see the module docstring)."""
    reservation_id, tokens, booking_id = call.reservation_id, call.tokens, call.booking_id
    state.calls = {rid: expiry for rid, expiry in state.calls.items() if expiry > now}
    state.bookings = {bid: slot for bid, slot in state.bookings.items() if slot + grace_ms > now}
    state.tags = {bid: tag for bid, tag in state.tags.items() if bid in state.bookings}
    if not state.bookings:
        state.lanes.clear()  # nobody waits: every tenant starts again from the virtual time
    held = booking_id if booking_id in state.bookings else None
    if limit.concurrency is not None and len(state.calls) >= limit.concurrency:
        return Decision(False, min(min(state.calls.values()), now + poll_ms), LimitReason.CONCURRENCY, held)
    if held is not None:
        refused = _claim(state, limit, now, held)
    else:
        refused = _book(state, limit, now, reservation_id, tokens, (call.lane, call.weight))
    if refused is not None:
        return refused
    if limit.rpm is not None:
        state.rpm_tat = max(state.rpm_tat, now) + limit.request_interval_ms
    if limit.concurrency is not None:
        state.calls[reservation_id] = now + lease_ms
    return Decision(True)


def _claim(state: KeyState, limit: ModelLimit, now: float, held: str) -> Decision | None:
    """Take the slot of booking `held` when it has come; a refusal keeps the booking."""
    slot = state.bookings[held]
    if slot > now:
        return Decision(False, slot, LimitReason.SLOT, held)
    if state.paused_until > now:
        return Decision(False, state.paused_until, LimitReason.PAUSED, held)
    # The rate is checked again on the real send time: a caller that came back late
    # must not crowd the one that follows it.
    if limit.rpm is not None:
        allowed = max(state.rpm_tat, now) - (limit.burst - 1) * limit.request_interval_ms
        if allowed > now:
            return Decision(False, allowed, LimitReason.SLOT, held)
    del state.bookings[held]
    state.vtime = max(state.vtime, state.tags.pop(held, 0.0))
    return None


def _book(
    state: KeyState, limit: ModelLimit, now: float, reservation_id: str, tokens: int, lane: tuple[str, int]
) -> Decision | None:
    """Book a slot for a call that has none, in the fair order of tenants, unless it may go now (then None).

    Start-time fair queueing: a booking's tag is its tenant's last tag (or the virtual time,
    if that is later) plus 1 / weight, and waiting calls are served in the order of their
    tags. A tenant alone is served one slot after another; beside others, each gets its
    weighted share of the slots. A booking whose tag comes before waiting ones takes the slot
    of the first of them, and they move one interval later (each learns it when it comes
    back, as a `slot` wait), so a newcomer is not queued behind an earlier crowd.
    """
    tenant, weight = lane
    tag = max(state.vtime, state.lanes.get(tenant, 0.0)) + 1 / weight
    behind = [bid for bid, other in state.tags.items() if other > tag]
    ahead = [state.bookings[bid] for bid, other in state.tags.items() if other <= tag]
    slot, reason = now, None
    if state.paused_until > slot:
        slot, reason = state.paused_until, LimitReason.PAUSED
    queued = min(state.bookings[bid] for bid in behind) if behind else None
    if queued is None and ahead:
        queued = max(ahead) + limit.request_interval_ms
    if queued is not None and queued > slot:
        slot, reason = queued, LimitReason.RPM if limit.rpm is not None else LimitReason.TPM
    if limit.rpm is not None:
        allowed = max(state.rpm_tat, now) - (limit.burst - 1) * limit.request_interval_ms
        if allowed > slot:
            slot, reason = allowed, LimitReason.RPM
    if limit.tpm is not None:
        start = max(state.tpm_tat, now)
        allowed = start + (tokens - limit.token_room) * limit.token_interval_ms
        state.tpm_tat = start + tokens * limit.token_interval_ms
        if allowed > slot:
            slot, reason = allowed, LimitReason.TPM
    if reason is None:
        return None
    for bid in behind:
        if state.bookings[bid] >= slot:
            state.bookings[bid] += limit.request_interval_ms
    state.bookings[reservation_id] = slot
    state.tags[reservation_id] = tag
    state.lanes[tenant] = tag
    return Decision(False, slot, reason, reservation_id)


def settle_state(state: KeyState, limit: ModelLimit, reservation_id: str, reserved: int, actual: int | None) -> None:
    """Free the call's slot and count `actual` tokens instead of `reserved` (None: keep the reservation)."""
    state.calls.pop(reservation_id, None)
    if limit.tpm is not None and actual is not None:
        state.tpm_tat += (actual - reserved) * limit.token_interval_ms


def pause_state(state: KeyState, limit: ModelLimit, until_ms: float) -> None:
    """Pause the key until `until_ms`; the request rate restarts from there, so waiting calls spread out."""
    state.paused_until = max(state.paused_until, until_ms)
    if limit.rpm is not None:
        state.rpm_tat = max(state.rpm_tat, until_ms + (limit.burst - 1) * limit.request_interval_ms)


def to_datetime(ms: float) -> datetime:
    """A time in milliseconds since the epoch as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)


class LimiterOptions(TypedDict, total=False):
    """The options both limiters take, with `KeyedModelLimiter`'s defaults."""

    default_output_tokens: int
    """Output tokens reserved when the model sets no `max_tokens`."""
    call_lease_s: float
    """How long a granted call holds its concurrency slot unless settled."""
    booking_grace_s: float
    """How long after its slot a booking may still be claimed."""
    concurrency_poll_s: float
    """How long a call that found every slot taken waits before asking again."""
    tenant_weights: Mapping[str, int] | None
    """The share of each tenant while several have calls queued (a tenant not named weighs 1;
    calls without a tenant share one lane)."""


class KeyedModelLimiter(ABC):
    """What both limiters share: the limits by key, the tenants' weights and the timing of slots.

    A key without a limit is granted here, at no cost; a subclass decides the calls against a
    limited key (`_decide`) and keeps their state (`settle`, `pause`).
    """

    def __init__(
        self,
        limits: Mapping[str, ModelLimit],
        *,
        default_output_tokens: int = DEFAULT_OUTPUT_TOKENS,
        call_lease_s: float = DEFAULT_CALL_LEASE_S,
        booking_grace_s: float = DEFAULT_BOOKING_GRACE_S,
        concurrency_poll_s: float = DEFAULT_CONCURRENCY_POLL_S,
        tenant_weights: Mapping[str, int] | None = None,
    ) -> None:
        self.limits = dict(limits)
        self.tenant_weights = check_weights(tenant_weights or {})
        self.default_output_tokens = default_output_tokens
        self._lease_ms = call_lease_s * 1000
        self._grace_ms = booking_grace_s * 1000
        self._poll_ms = concurrency_poll_s * 1000

    def limit_for(self, key: str) -> ModelLimit | None:
        """The limits of `key`, or None when calls against it are not limited."""
        return self.limits.get(key)

    def acquire(
        self,
        key: str,
        estimated_tokens: int,
        reservation_id: str,
        booking_id: str | None = None,
        tenant: str | None = None,
    ) -> LimitGrant | LimitWait:
        """Grant a call now, or say until when there is no capacity (see `ModelLimiter.acquire`).

        Raises:
            StoreUnavailableError: The shared state could not be reached in time.
        """
        limit = self.limits.get(key)
        if limit is None:
            return LimitGrant(key, reservation_id, estimated_tokens)
        lane = tenant or ""
        call = LimitedCall(key, estimated_tokens, reservation_id, booking_id, lane, self.tenant_weights.get(lane, 1))
        return answer(key, reservation_id, estimated_tokens, self._decide(limit, call))

    @abstractmethod
    def _decide(self, limit: ModelLimit, call: LimitedCall) -> Decision:
        """The decision on one call against a limited key."""

    @abstractmethod
    def settle(self, grant: LimitGrant, actual_tokens: int | None) -> None:
        """Count the call's actual tokens and free its slot."""

    def release(self, grant: LimitGrant) -> None:
        """Free the call's slot, keeping its reservation."""
        self.settle(grant, None)

    @abstractmethod
    def pause(self, key: str, until: datetime) -> None:
        """No call against `key` may go before `until`."""


class InProcessModelLimiter(KeyedModelLimiter):
    """A `ModelLimiter` in this process's memory: the embedded default, for one process.

    Args:
        limits: The limits by key; keys not named are not limited.
        clock: Seconds since the epoch (tests may pass a fake clock).
        **options: The options of every limiter (`LimiterOptions`).
    """

    def __init__(
        self,
        limits: Mapping[str, ModelLimit],
        *,
        clock: Callable[[], float] = time.time,
        **options: Unpack[LimiterOptions],
    ) -> None:
        super().__init__(limits, **options)
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, KeyState] = {}

    def _decide(self, limit: ModelLimit, call: LimitedCall) -> Decision:
        with self._lock:
            state = self._states.setdefault(call.key, KeyState())
            now = _ms(self._clock())
            return decide(
                state, limit, now, call, lease_ms=self._lease_ms, grace_ms=self._grace_ms, poll_ms=self._poll_ms
            )

    def settle(self, grant: LimitGrant, actual_tokens: int | None) -> None:
        """Count the call's actual tokens and free its slot."""
        limit = self.limits.get(grant.key)
        if limit is None:
            return
        with self._lock:
            state = self._states.setdefault(grant.key, KeyState())
            settle_state(state, limit, grant.reservation_id, grant.tokens, actual_tokens)

    def pause(self, key: str, until: datetime) -> None:
        """No call against `key` may go before `until`."""
        limit = self.limits.get(key)
        if limit is None:
            return
        with self._lock:
            pause_state(self._states.setdefault(key, KeyState()), limit, _ms(until.timestamp()))


def _ms(seconds: float) -> float:
    # Whole microseconds, as the Redis scripts keep times: both limiters then decide alike.
    return round(seconds * 1000, 3)


def answer(key: str, reservation_id: str, tokens: int, decision: Decision) -> LimitGrant | LimitWait:
    """The grant or the wait a `Decision` stands for."""
    if decision.granted:
        return LimitGrant(key, reservation_id, tokens)
    assert decision.reason is not None
    return LimitWait(key, to_datetime(decision.until_ms), decision.reason, decision.booking_id)


def estimate_tokens(parts: list[Any], output_tokens: int) -> int:
    """A cheap upper-leaning estimate of a call's tokens: about 4 characters a token, plus the output allowance."""
    characters = 0
    for part in parts:
        characters += len(part) if isinstance(part, str) else len(json.dumps(part, default=str))
    return math.ceil(characters / 4) + output_tokens
