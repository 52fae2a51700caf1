"""Every Redis key the store uses, built under one configurable namespace prefix.

No other module spells a key; they all ask a `RedisKeys` for it, so the layout can be
read (and changed) in one place:

| key | type | lifetime | written by |
|---|---|---|---|
| `{prefix}:turn:{<turn_id>}:lease` | hash `owner`, `fence` | the lease TTL | `lease_acquire.lua`, `lease_renew.lua`, `lease_release.lua` |
| `{prefix}:turn:{<turn_id>}:fence` | integer counter | the fence TTL (24 h), renewed by each acquire | `lease_acquire.lua` |
| `{prefix}:conversation:{<conversation>}:active-turn` | string, a turn id | until released | `guard_*.lua` |
| `{prefix}:turn:{<root_turn_id>}:events` | stream of live events of a turn tree | the live retention after the last publish | `RedisLiveEvents` (`live_publish.lua`) |
| `{prefix}:conversation:{<conversation>}:events` | stream of live events of a conversation | the same | `RedisLiveEvents` (`live_publish.lua`) |
| `{prefix}:model-limit:{<limit key>}` | hash `rpm_tat`, `tpm_tat`, `paused_until`, `vtime` | a minute and the call lease after its last use | `model_limit_*.lua` |
| `{prefix}:model-limit:{<limit key>}:calls` | sorted set: reservation id by expiry | the same | `model_limit_acquire.lua`, `model_limit_settle.lua` |
| `{prefix}:model-limit:{<limit key>}:bookings` | sorted set: booking id by slot time | the same | `model_limit_acquire.lua` |
| `{prefix}:model-limit:{<limit key>}:tags` | sorted set: booking id by its place in the fair order of tenants | the same | `model_limit_acquire.lua` |
| `{prefix}:model-limit:{<limit key>}:lanes` | hash: tenant -> the tag of its last booking | the same | `model_limit_acquire.lua` |
| `{prefix}:admission:{<queue>}` | hash `vtime` | until nobody waits | `admission.lua` |
| `{prefix}:admission:{<queue>}:tenants` | sorted set: tenant with turns waiting -> the tag of its next turn | while it waits | `admission.lua` |
| `{prefix}:admission:{<queue>}:lanes` | hash: tenant -> the tag after its last admitted turn | until nobody waits | `admission.lua` |
| `{prefix}:admission:{<queue>}:slots` | sorted set: admitted turn not yet started -> expiry of its slot | until it starts or the slot expires | `admission.lua` |
| `{prefix}:admission:{<queue>}:turns` | hash: turn -> its state and tenant | until it ends, waits for a person, or its lease expires | `admission.lua` |
| `{prefix}:admission:{<queue>}:waiting:<tenant>` | list of turn ids, oldest first | until admitted | `admission.lua` |
| `{prefix}:admission:{<queue>}:active:<tenant>` | sorted set: admitted or started turn -> expiry | until it ends, waits for a person, or expires | `admission.lua` |

`<conversation>` names a conversation by its id and its tenant (`conversation_tag`): the id
alone without a tenant, `<tenant>/<id>` with one. Neither a tenant name nor an id may hold a
`/`, so the two forms never meet, and the keys of a conversation are the same ones that
servers which stored the tenant inside the conversation id used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent_runner.persistence import ConversationKey, EventScope

DEFAULT_PREFIX = "agent-runner"
"""The namespace of every key unless a deployment chooses another one."""

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def _require_id(kind: str, value: str) -> str:
    # An empty id would give the empty hash tag `{}`, which Redis Cluster ignores: the lease
    # and fence keys of one turn could then land in different slots and no script could
    # touch both.
    if not value:
        raise ValueError(f"a Redis key needs a non-empty {kind}, got {value!r}")
    return value


@dataclass(frozen=True)
class RedisKeys:
    """Builds the Redis keys of one namespace.

    The id inside each key is wrapped in braces, a Redis Cluster hash tag: the keys that
    one script touches together (a turn's lease and its fence counter) always hash to the
    same slot. The one exception is `live_publish.lua`, which appends a batch of live
    events to the streams of many trees and conversations in one call: it needs a
    standalone Redis (the only kind of client the store builds), not a Cluster.
    `admission.lua` builds its per-tenant keys from a base it is given; they carry the base's
    hash tag, so they share its slot.

    Attributes:
        prefix: The namespace every key starts with, followed by `:`.
    """

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError(f"the Redis key prefix must not be empty, got {self.prefix!r}")

    def turn_lease(self, turn_id: str) -> str:
        """Return the key of the turn's lease: a hash of `owner` and `fence` that expires with the lease."""
        return f"{self.prefix}:turn:{{{_require_id('turn id', turn_id)}}}:lease"

    def turn_fence(self, turn_id: str) -> str:
        """Return the key of the turn's fencing counter, which outlives every lease of the turn by the fence TTL."""
        return f"{self.prefix}:turn:{{{_require_id('turn id', turn_id)}}}:fence"

    def turn_events(self, root_turn_id: str) -> str:
        """Return the key of the live event stream of a turn tree (its root and every descendant)."""
        return f"{self.prefix}:turn:{{{_require_id('turn id', root_turn_id)}}}:events"

    def conversation_events(self, conversation: ConversationKey) -> str:
        """Return the key of the live event stream of a conversation."""
        return f"{self.prefix}:conversation:{{{conversation_tag(conversation)}}}:events"

    def events(self, scope: EventScope) -> str:
        """Return the key of the live event stream of a scope: `turn_events` or `conversation_events`."""
        if scope.kind == "tree":
            return self.turn_events(scope.id)
        return self.conversation_events(ConversationKey(scope.id, scope.tenant_id))

    def active_turn(self, conversation: ConversationKey) -> str:
        """Return the key holding the id of the conversation's active turn."""
        return f"{self.prefix}:conversation:{{{conversation_tag(conversation)}}}:active-turn"

    def model_limit(self, limit_key: str) -> tuple[str, str, str, str, str]:
        """Return the keys of a model limit: its state, concurrent calls, bookings, their fair order and tenant lanes."""
        base = f"{self.prefix}:model-limit:{{{_require_id('limit key', limit_key)}}}"
        return base, f"{base}:calls", f"{base}:bookings", f"{base}:tags", f"{base}:lanes"

    def admission(self, queue: str) -> tuple[str, str, str, str, str, str]:
        """Return the keys of the admission of new turns to `queue`: state, tenants, lanes, slots, turns, and the base of the per-tenant keys.

        The per-tenant keys (`<base>:waiting:<tenant>`, `<base>:active:<tenant>`) are built by
        `admission.lua` from the base; the hash tag keeps them in the slot of the others.
        """
        base = f"{self.prefix}:admission:{{{_require_id('queue', queue)}}}"
        return base, f"{base}:tenants", f"{base}:lanes", f"{base}:slots", f"{base}:turns", base

    def pattern(self) -> str:
        """Return a `SCAN MATCH` pattern matching every key of this namespace and no other."""
        return _GLOB_SPECIAL.sub(r"\\\1", self.prefix) + ":*"


def conversation_tag(conversation: ConversationKey) -> str:
    """The part of a Redis key that names a conversation: its id, after `<tenant>/` for a tenant's."""
    own = _require_id("conversation id", conversation.conversation_id)
    return own if conversation.tenant_id is None else f"{conversation.tenant_id}/{own}"
