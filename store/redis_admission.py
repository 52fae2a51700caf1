"""Admission of new turns in Redis: tenants share the fleet's start of new turns by weight.

The broker's queues are first in, first out: a tenant that starts thousands of turns at
once would put every other tenant's new turns behind all of them. With admission, a new
turn is not sent to the queue of new turns at once; it waits in a line of its tenant here,
and at most `window` admitted turns that no worker has started yet sit in the broker,
all tenants together. Whenever a slot frees (a worker starts a new turn, a slot's lease
expires) the next turns are admitted in start-time fair order: each tenant's next turn is
tagged its previous turn's tag plus 1 / weight (or the virtual time, the tag of the turn
admitted last, if that is later), and the smallest tag goes first. A tenant alone gets the
whole window; a newcomer is not lined up behind another tenant's crowd.

Every decision is one call of `store/lua/admission.lua`, which returns the turns it
admitted: the caller sends them. A turn admitted but never started (its message was lost,
its worker died) gives its slot back when the slot's lease expires; a started turn whose
end was never reported stops counting against its tenant's cap when its active lease does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis

from agent_runner.errors import DefinitionError
from agent_runner.model_limits import check_weights
from store._closing import ClosesOnExit
from store._scripts import RedisScripts
from store.keys import DEFAULT_PREFIX, RedisKeys

DEFAULT_SLOT_LEASE_S = 300.0
"""How long an admitted turn holds its slot unless a worker starts it."""
DEFAULT_ACTIVE_LEASE_S = 3600.0
"""How long a started turn counts against its tenant's cap unless its end (or a wait for a person) is reported."""


@dataclass(frozen=True)
class AdmissionDecision:
    """What one admission call decided."""

    admitted: tuple[str, ...]
    """Turns admitted by this call, oldest of each tenant first: the caller sends their first steps."""
    place: int
    """The turn's place in its tenant's line (1: next); 0 when it does not wait (admitted, started, unknown)."""
    tenant_waiting: int
    """Turns of the tenant waiting for admission after the call."""
    tenant_active: int
    """Turns of the tenant admitted or started and not yet ended or waiting for a person."""
    tenant: str | None
    """The tenant the counts are of: the one asked about, or the released turn's (None: turns without a tenant)."""


class RedisAdmission(ClosesOnExit):
    """The admission of new turns to one queue, kept in Redis and shared by every process of a fleet.

    Args:
        queue: The queue whose new turns are admitted (`AGENT_RUNNER_QUEUE`); its name keys the state.
        redis_url: URL of the Redis server.
        window: Most admitted turns not yet started by a worker, all tenants together.
        tenant_max_in_flight: Most turns of one tenant admitted or started and not yet ended or
            waiting for a person; None: no cap.
        tenant_weights: Each tenant's share while several wait (a tenant not named weighs 1;
            turns without a tenant share one line).
        prefix: Namespace of the keys (see `store.keys`).
        client: A client to use instead of one built from `redis_url`; left open by `close()`.
        slot_lease_s: How long an admitted turn holds its slot unless it starts.
        active_lease_s: How long a started turn counts against the cap unless its end is reported.
        clock: Seconds since the epoch to decide with instead of the Redis clock (tests).

    Raises:
        DefinitionError: A window, cap or lease below one, or a weight that is not a whole number above zero.
    """

    def __init__(
        self,
        queue: str,
        redis_url: str | None = None,
        *,
        window: int,
        tenant_max_in_flight: int | None = None,
        tenant_weights: Mapping[str, int] | None = None,
        prefix: str = DEFAULT_PREFIX,
        client: Redis[Any] | None = None,
        slot_lease_s: float = DEFAULT_SLOT_LEASE_S,
        active_lease_s: float = DEFAULT_ACTIVE_LEASE_S,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if window < 1:
            raise DefinitionError(f"the admission window must be at least 1, got {window!r}")
        if tenant_max_in_flight is not None and tenant_max_in_flight < 1:
            raise DefinitionError(
                f"the most turns in flight per tenant must be at least 1, got {tenant_max_in_flight!r}"
            )
        if slot_lease_s <= 0 or active_lease_s <= 0:
            raise DefinitionError(f"admission leases must be above zero, got {slot_lease_s!r} and {active_lease_s!r}")
        self.queue = queue
        self.window = window
        self.tenant_max_in_flight = tenant_max_in_flight
        self.tenant_weights = check_weights(tenant_weights or {})
        self._keys = list(RedisKeys(prefix).admission(queue))
        self._scripts = RedisScripts(redis_url, client, ("admission",))
        self._fixed = [
            str(window),
            str(tenant_max_in_flight or 0),
            f"{slot_lease_s * 1000:.3f}",
            f"{active_lease_s * 1000:.3f}",
            json.dumps(self.tenant_weights),
        ]
        self._clock = clock

    def enqueue(self, turn_id: str, tenant: str | None) -> AdmissionDecision:
        """Line the new turn up behind its tenant's waiting turns, then admit what the window allows.

        A turn already waiting or admitted keeps its place (the sweeps call this again for
        turns that look forgotten); one known as started waits again (its worker died before
        saving its first step).

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        return self._run("enqueue", turn_id, tenant)

    def start(self, turn_id: str, tenant: str | None) -> AdmissionDecision:
        """A worker took the turn's first step: its slot frees, it counts as active, and the next turns are admitted.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        return self._run("start", turn_id, tenant)

    def release(self, turn_id: str) -> AdmissionDecision:
        """The turn ended, waits for a person or another turn, or will not run: it stops counting; admit the next.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        return self._run("release", turn_id, None)

    def pump(self) -> AdmissionDecision:
        """Give back expired slots and admit what the window allows (the admission sweep).

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        return self._run("pump", "", None)

    def lined_up(self, turn_ids: Sequence[str]) -> set[str]:
        """Those of `turn_ids` that wait for admission or hold a slot (one round trip; nothing is admitted).

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        if not turn_ids:
            return set()
        now = "" if self._clock is None else f"{self._clock() * 1000:.3f}"
        reply = self._scripts.run("admission", self._keys, ["lined-up", " ".join(turn_ids), "", now, *self._fixed])
        return {str(turn_id) for turn_id in reply}

    def _run(self, op: str, turn_id: str, tenant: str | None) -> AdmissionDecision:
        now = "" if self._clock is None else f"{self._clock() * 1000:.3f}"
        reply = self._scripts.run("admission", self._keys, [op, turn_id, tenant or "", now, *self._fixed])
        place, waiting, active, tenant, *admitted = reply
        return AdmissionDecision(
            tuple(str(i) for i in admitted), int(place), int(waiting), int(active), str(tenant) or None
        )

    def close(self) -> None:
        """Close the client built from `redis_url`."""
        self._scripts.close()
