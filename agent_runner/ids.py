"""Identifiers and the clock every package uses, so turns, messages and rows agree on both."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime


def new_id() -> str:
    """Return a new random identifier (32 hex characters).

    128 random bits (a UUID4 has 122), without building a `uuid.UUID`: ids are opaque
    text, never parsed as UUIDs, and one is made for every message a model returns.
    """
    return os.urandom(16).hex()


def utcnow() -> datetime:
    """Return the current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def queued_turn_id(conversation_id: str, message_id: str, tenant_id: str | None = None) -> str:
    """Return the id of the turn started from the queued message `message_id` of a conversation (32 hex characters).

    Derived from the conversation (its id and tenant) and the message id, so the message's
    events can name the turn before it exists, a message can start at most one turn (a
    second start of the same id is refused), and two tenants' messages never share a turn id.
    """
    # `<tenant>/<conversation>` is hashed for a tenant's conversation: neither part may hold
    # a `/`, and the ids of messages queued by earlier versions, which stored that text as
    # the conversation id, stay the same.
    conversation = conversation_id if tenant_id is None else f"{tenant_id}/{conversation_id}"
    digest = hashlib.sha256(f"queued-message\x00{conversation}\x00{message_id}".encode())
    return digest.hexdigest()[:32]
