"""Identifiers and the clock every package uses, so turns, messages and rows agree on both."""

from __future__ import annotations

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
