"""Functions run in separate (spawned) processes by the multi-process store tests.

Each one opens its own store from a URL, waits for a common start instant so that the
processes really contend, and returns plain data the test process can check.
"""

from __future__ import annotations

import random
import time
from typing import Any

import sqlalchemy as sa

from agent_runner import AgentConversationBusyException, AgentTurn
from agent_runner.persistence import ConversationKey
from store import Inbox, SqlAgentTurnStore, SqlTurnLease
from store.schema import inbox_messages


def sleep_until(instant: float) -> None:
    delay = instant - time.time()
    if delay > 0:
        time.sleep(delay)


def warm_up(_: int) -> int:
    """Occupies a pool worker briefly, so a batch of these reaches every worker once."""
    time.sleep(0.2)
    return 0


def create_active_turn(url: str, conversation_id: str, index: int, start_at: float) -> tuple[str, str]:
    """Try to create a non-terminal turn of the conversation; report ("created", id) or ("busy", active id)."""
    turn_id = f"racer-{index}"
    turn = AgentTurn(id=turn_id, agent_id="racer", root_turn_id=turn_id, conversation_id=conversation_id)
    with SqlAgentTurnStore(url) as turns:
        with turns.engine.connect():
            pass  # open the pooled connection before the race starts
        sleep_until(start_at)
        try:
            turns.save(turn, -1)
        except AgentConversationBusyException as busy:
            return ("busy", busy.active_turn_id)
        return ("created", turn_id)


def claim_until_empty(url: str, conversations: list[str], seed: int, start_at: float) -> list[dict[str, Any]]:
    """Claim and complete inbox messages until none is pending; check the order at every claim.

    While this process holds a message PROCESSING, nobody else can claim or complete
    another message of its conversation, so the check sees a stable picture.
    """
    rng = random.Random(seed)
    claims: list[dict[str, Any]] = []
    with Inbox(url) as inbox:
        sleep_until(start_at)
        for _ in range(5_000):
            order = list(conversations)
            rng.shuffle(order)
            claimed_any = False
            for conversation in order:
                message = inbox.claim_next(ConversationKey(conversation))
                if message is None:
                    continue
                claimed_any = True
                with inbox.engine.connect() as connection:
                    rows = connection.execute(
                        sa.select(inbox_messages.c.sequence, inbox_messages.c.status).where(
                            inbox_messages.c.conversation_id == conversation
                        )
                    ).all()
                out_of_order = [
                    (sequence, status)
                    for sequence, status in rows
                    if (sequence < message.sequence and status != "COMPLETED")
                    or (sequence > message.sequence and status != "PENDING")
                    or (sequence == message.sequence and status != "PROCESSING")
                ]
                claims.append(
                    {
                        "message_id": message.message_id,
                        "conversation_id": conversation,
                        "sequence": message.sequence,
                        "out_of_order": out_of_order,
                    }
                )
                assert inbox.mark_completed(message.message_id, f"turn-{message.message_id}")
            if not claimed_any:
                with inbox.engine.connect() as connection:
                    pending = connection.execute(
                        sa.select(sa.func.count()).where(inbox_messages.c.status != "COMPLETED")
                    ).scalar_one()
                if pending == 0:
                    break
                time.sleep(0.001)
    return claims


def hold_lease_repeatedly(url: str, owner: str, start_at: float, seconds: float) -> list[tuple[int, float, float]]:
    """Acquire, hold briefly and release one turn's lease again and again; report (fence, start, end)."""
    held: list[tuple[int, float, float]] = []
    with SqlTurnLease(url) as lease:
        sleep_until(start_at)
        deadline = time.monotonic() + seconds
        for _ in range(10_000):
            if time.monotonic() > deadline:
                break
            acquired = lease.acquire("contended-turn", owner, ttl_ms=5_000)
            if acquired is None:
                time.sleep(0.001)
                continue
            # CLOCK_MONOTONIC is shared by every process on the machine, so the intervals
            # of all processes can be compared: they must never overlap.
            start = time.monotonic()
            time.sleep(0.005)
            end = time.monotonic()
            assert lease.release(acquired), "a lease held well inside its TTL could not be released"
            held.append((acquired.fence, start, end))
    return held
