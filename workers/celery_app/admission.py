"""Fair admission of new turns to the Celery queue of new turns: `TurnAdmission`.

With `AGENT_RUNNER_ADMISSION_WINDOW` set, a new turn's first step is not sent to the queue of
new turns when the turn is saved READY; the turn waits in its tenant's line in Redis
(`store.redis_admission`), and at most the window's worth of admitted turns that no worker
has started yet sit in the broker. Each call here returns the turns the admission just let
in, and this module sends their first steps. Continuations never pass through here: they go
to the main queue, which workers take from first.

Nothing is lost when Redis fails: a turn that cannot be lined up is sent at once (today's
first-in, first-out order) with a warning; a turn whose line Redis forgot (a restart, a flush)
is READY at version 0, so the stale-turn sweep finds it and lines it up again; an admitted
turn that never starts gives its slot back when the slot's lease expires, and the admission
sweep fills the window again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent_runner import AgentEvent, AgentEventType, AgentRunnerError, AgentTurn
from agent_runner.event_payloads import turn_queued
from store.redis_admission import AdmissionDecision, RedisAdmission
from workers.settings import WorkerSettings
from workers.telemetry import record_admission, set_admission_gauges

logger = logging.getLogger("workers")

SendFirstStep = Callable[[str, int], bool]
"""Sends `step_turn(turn_id, version)` to the queue (`CeleryDispatcher.send_step`)."""

_RELEASING_EVENTS = frozenset({AgentEventType.TURN_SUSPENDED})
"""Events after which a turn no longer counts as active besides the terminal ones: it waits for a person,
a tool or a child (a child is a new turn itself, so a parent that kept its place could starve it)."""


class TurnAdmission:
    """Lines new turns up for fair admission and sends the first steps of those admitted.

    Also an event listener of the runner: a turn that ends or is suspended stops counting
    against its tenant's cap, and the turns that frees are admitted.

    Args:
        admission: The shared admission state in Redis.
        send: Sends a first step (`step_turn(turn_id, 0)`) to the queue of new turns.

    Attributes:
        announce: Sends a TURN_QUEUED event to the live channel when a turn waits (the
            wiring sets it to the runner's live publisher); None sends none.
    """

    def __init__(self, admission: RedisAdmission, send: SendFirstStep) -> None:
        self.admission = admission
        self.send = send
        self.announce: Callable[[AgentEvent], None] | None = None

    def enqueue(self, turn: AgentTurn) -> AdmissionDecision | None:
        """Line the new turn up and send what was admitted; None when Redis could not be asked (the caller sends the turn itself)."""
        tenant = turn.tenant_id
        try:
            decision = self.admission.enqueue(turn.id, tenant)
        except AgentRunnerError as exc:
            logger.warning("could not line turn %s up for admission (%s); sending it at once", turn.id, exc)
            return None
        self._send(decision)
        _set_gauges(decision)
        if decision.place:
            record_admission(tenant, waited=True)
            logger.debug("turn %s waits for admission, place %d of tenant %r", turn.id, decision.place, tenant)
            self._announce(turn, decision)
        elif turn.id in decision.admitted:
            record_admission(tenant, waited=False)
        return decision

    def _announce(self, turn: AgentTurn, decision: AdmissionDecision) -> None:
        if self.announce is None:
            return
        body = turn_queued(decision.place, decision.tenant_waiting)
        event = AgentEvent(
            type=body.type,
            turn_id=turn.id,
            root_turn_id=turn.root_turn_id,
            conversation_id=turn.conversation_id,
            tenant_id=turn.tenant_id,
            data=body.data(turn.status, turn.version),
        )
        self.announce(event)

    def start(self, turn_id: str, tenant: str | None) -> None:
        """A worker took the turn's first step: its slot frees; send the turns admitted in its place."""
        decision = self._call(lambda: self.admission.start(turn_id, tenant), f"the start of turn {turn_id}")
        if decision is not None:
            _set_gauges(decision)

    def release(self, turn_id: str) -> None:
        """The turn ended, waits, or will not run: send the turns admitted in its place."""
        decision = self._call(lambda: self.admission.release(turn_id), f"the end of turn {turn_id}")
        if decision is not None:
            _set_gauges(decision)

    def pump(self) -> int:
        """Give back expired slots and send what the window then admits (the admission sweep); return how many."""
        decision = self._call(self.admission.pump, "the admission sweep")
        return 0 if decision is None else len(decision.admitted)

    def lined_up(self, turn_ids: list[str]) -> set[str]:
        """Those of the new turns that wait for admission or hold a slot; none when Redis cannot be asked."""
        try:
            return self.admission.lined_up(turn_ids)
        except AgentRunnerError as exc:
            logger.warning("could not ask the admission which turns wait (%s); lining them all up again", exc)
            return set()

    def __call__(self, event: AgentEvent) -> None:
        """Release the turn of a terminal or suspension event."""
        if event.type.is_terminal or event.type in _RELEASING_EVENTS:
            self.release(event.turn_id)

    def close(self) -> None:
        """Close the Redis client."""
        self.admission.close()

    def _call(self, decide: Callable[[], AdmissionDecision], what: str) -> AdmissionDecision | None:
        try:
            decision = decide()
        except AgentRunnerError as exc:
            # The slot's lease and the admission sweep make up for it.
            logger.warning("could not report %s to the admission (%s); the admission sweep will catch up", what, exc)
            return None
        self._send(decision)
        return decision

    def _send(self, decision: AdmissionDecision) -> None:
        for turn_id in decision.admitted:
            self.send(turn_id, 0)


def _set_gauges(decision: AdmissionDecision) -> None:
    set_admission_gauges(decision.tenant, decision.tenant_waiting, decision.tenant_active)


def build_admission(settings: WorkerSettings, send: SendFirstStep) -> TurnAdmission | None:
    """The admission of `settings` in the deployment's Redis; None when `AGENT_RUNNER_ADMISSION_WINDOW` is not set."""
    if settings.admission_window is None:
        return None
    admission = RedisAdmission(
        settings.queue,
        settings.redis_url,
        prefix=settings.redis_prefix,
        window=settings.admission_window,
        tenant_max_in_flight=settings.tenant_max_in_flight,
        tenant_weights=settings.admission_tenant_weights,
        slot_lease_s=settings.admission_slot_lease_s,
    )
    return TurnAdmission(admission, send)
