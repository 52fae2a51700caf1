"""The active-conversation guard in Redis: a fast, shared marker of each conversation's one active turn."""

from __future__ import annotations

from typing import Any

from redis import Redis

from agent_runner.persistence import ConversationKey
from store._closing import ClosesOnExit
from store._scripts import RedisScripts
from store.keys import DEFAULT_PREFIX, RedisKeys

_SCRIPTS = ("guard_claim", "guard_holder", "guard_replace", "guard_release")


class RedisConversationGuard(ClosesOnExit):
    """A `ConversationGuard` kept in Redis: one key per conversation holding its active turn id.

    The mark has no TTL, because an active turn may wait days for a person. It is only a
    fast path: the SQL turn store stays the truth, and its partial unique index refuses a
    second active turn even when this guard lost its data (a Redis restart without
    persistence, a flush). The runner repairs the guard from the store when they disagree:
    it claims again for a conversation whose mark vanished, and replaces a holder the store
    reports as terminal.

    Every operation is one Lua script, so a compare and the write that follows it cannot
    interleave with another process's. One instance may be shared by threads. Use it as a
    context manager, or call `close()`, to close the client built from `redis_url`.

    Args:
        redis_url: URL of the Redis server, such as `redis://127.0.0.1:6379/0`.
        prefix: Namespace of the keys (see `store.keys`).
        client: A client to use instead of one built from `redis_url`; left open by `close()`.
    """

    def __init__(
        self, redis_url: str | None = None, *, prefix: str = DEFAULT_PREFIX, client: Redis[Any] | None = None
    ) -> None:
        self._keys = RedisKeys(prefix)
        self._scripts = RedisScripts(redis_url, client, _SCRIPTS)

    def claim(self, conversation: ConversationKey, turn_id: str) -> str:
        """Mark `turn_id` active if the conversation has no holder; return the holder after the call.

        The claim succeeded when the returned id is `turn_id`.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        return str(self._scripts.run("guard_claim", [self._keys.active_turn(conversation)], [turn_id]))

    def holder(self, conversation: ConversationKey) -> str | None:
        """Return the turn id marked active, or None.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        held = self._scripts.run("guard_holder", [self._keys.active_turn(conversation)], [])
        return None if held is None else str(held)

    def replace(self, conversation: ConversationKey, expected_holder: str, turn_id: str) -> bool:
        """Move the mark from `expected_holder` (known to be terminal) to `turn_id`, atomically.

        Returns False, changing nothing, when `expected_holder` does not hold the mark,
        including when nobody does (then `claim` is the call to make).

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        replaced = self._scripts.run(
            "guard_replace", [self._keys.active_turn(conversation)], [expected_holder, turn_id]
        )
        return bool(replaced == 1)

    def release(self, conversation: ConversationKey, turn_id: str) -> bool:
        """Clear the mark if `turn_id` holds it; False otherwise.

        Raises:
            StoreUnavailableError: Redis could not be reached in time.
        """
        released = self._scripts.run("guard_release", [self._keys.active_turn(conversation)], [turn_id])
        return bool(released == 1)

    def close(self) -> None:
        """Close the Redis client built from `redis_url` (a client passed in stays open)."""
        self._scripts.close()
