"""`Idempotency-Key` on the POST routes: a retried request gets the first answer and never acts twice.

The first request with a key claims it (IN_PROGRESS), acts, and records its answer
(COMPLETED); a retry with the key replays that answer. Recording is a write of its own,
after the action, so the action can have happened when the recording fails (the database
connection dropped just then) or never comes (the process died). The key then stays
IN_PROGRESS, and a retry tells what the earlier attempt did from what its action saved,
never by guessing:

- a start names its turn and its user message (the queued message, if it was queued) by
  ids derived from the tenant and the key: a retry finds that turn, or that queued
  message, and answers with it;
- a resume carries the derived id in its metadata (`store.idempotency.RESUME_MARK`),
  which the turn's TURN_RESUMED event keeps: a retry that finds it answers with the turn;
- a cancel has happened when the turn is cancelled or carries its cancel flag.

When nothing is found the retry acts. The derived ids make a retry and an earlier attempt
that is still running converge on one effect (one turn, one queued message, one applied
decision), and the first answer recorded is the one both give. So a retry never waits
out a claim, and never acts a second time.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse

from agent_runner import AgentTurn, AgentTurnStatus, StoreError
from agent_runner.ids import new_id
from store import IdempotencyStatus
from workers.api.errors import IdempotencyKeyReusedError, api_error_of, error_body
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant

logger = logging.getLogger("workers.api")

Answer = tuple[int, dict[str, Any]]
"""An HTTP status and its JSON body."""

REPLAYED = {"Idempotent-Replayed": "true"}
_TURN_NAMESPACE = uuid.UUID("0c9e7c1e-4b2f-4f7a-9d51-3e8a6f2b7d40")


def request_id(tenant: Tenant, key: str | None) -> str:
    """A stable id of the request: derived from the tenant and the key, or a new random one without a key.

    A keyed start uses it as the id of its user message (and of its queued message).
    """
    if key is None:
        return new_id()
    return hashlib.sha256(f"{tenant.id or ''}\x00{key}".encode()).hexdigest()[:32]


def turn_id_of(key: str | None, request: str) -> str | None:
    """The id of the turn a keyed start creates (None without a key: a random one)."""
    return None if key is None else uuid.uuid5(_TURN_NAMESPACE, request).hex


def is_cancelled(turn: AgentTurn) -> bool:
    """Whether a cancel has been applied to `turn` (ended CANCELLED, or flagged to end at its next boundary)."""
    return turn.status is AgentTurnStatus.CANCELLED or (turn.cancel_requested and not turn.is_terminal)


def run_once(
    runtime: Runtime,
    tenant: Tenant,
    key: str | None,
    fingerprint: str,
    act: Callable[[], Answer],
    find_earlier: Callable[[], Answer | None],
) -> JSONResponse:
    """Run `act` once per idempotency key: a retry gets the first answer, status and body alike.

    Answers below 500 are recorded (a 409 too: the retry gets the same 409). A failure of
    the server (5xx) records nothing, and neither does a failure to record: the key stays
    unanswered, and the retry asks `find_earlier` what the earlier attempt saved, answering
    with that (header `Idempotent-Replayed: true`) or acting when it finds nothing.

    Args:
        runtime: The server's backends.
        tenant: Who asks.
        key: The `Idempotency-Key` header (None: act without any of this).
        fingerprint: What was asked; the same key with another fingerprint is refused.
        act: Acts and returns the answer; its exceptions become error answers.
        find_earlier: The answer an earlier attempt with this key gave, told from what it
            saved, or None when it saved nothing.

    Raises:
        IdempotencyKeyReusedError: The key came with a different request before.
        ApiError: The server could not complete the request (5xx); a retry is safe.
    """
    if key is None:
        status, body = act()
        return JSONResponse(body, status_code=status)
    record = runtime.idempotency.claim(tenant.id, key, fingerprint)
    if record is not None and record.fingerprint != fingerprint:
        raise IdempotencyKeyReusedError(key)
    if record is not None and record.status is IdempotencyStatus.COMPLETED and record.response_status is not None:
        return JSONResponse(record.response_body, status_code=record.response_status, headers=REPLAYED)
    unanswered = record is not None
    headers: dict[str, str] = {}
    try:
        earlier = find_earlier() if unanswered else None
        status, body = act() if earlier is None else earlier
        if earlier is not None:
            headers = dict(REPLAYED)
    except Exception as exc:
        error = api_error_of(exc)
        if error.status >= 500:
            raise error from exc
        earlier = _found_meanwhile(find_earlier) if unanswered else None
        if earlier is None:
            status, headers = error.status, error.headers or {}
            body = error_body(error.type_name, error.message, error.details, **error.extra)
        else:
            (status, body), headers = earlier, dict(REPLAYED)
    try:
        recorded = runtime.idempotency.complete(tenant.id, key, status, body)
    except StoreError as exc:
        # The action's own saves tell a retry what happened; the answer stands.
        logger.warning("could not record the answer for idempotency key %r: %s", key, exc)
        recorded = None
    if recorded is not None and recorded.response_status is not None and recorded.response_body != body:
        # Another attempt with the key recorded its answer first: give the same one.
        return JSONResponse(recorded.response_body, status_code=recorded.response_status, headers=REPLAYED)
    return JSONResponse(body, status_code=status, headers=headers or None)


def _found_meanwhile(find_earlier: Callable[[], Answer | None]) -> Answer | None:
    """What an earlier attempt still running may have done since the first look; None when that look fails too.

    Asked after the action was refused (a 4xx): the refusal stands unless the earlier
    attempt's effect is found now.
    """
    try:
        return find_earlier()
    except Exception:
        return None
