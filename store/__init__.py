"""Durable backends of agent-runner: SQL turn store and event log, chat memory, inbox and lease; Redis lease, guard and live events.

The SQL backends run on PostgreSQL (psycopg 3) in production and on SQLite as the embedded
default, from the same code. Each takes a database URL or an engine to share:

    engine = store.make_engine("postgresql+psycopg://app@db/agents")
    store.migrate(engine)
    turns = store.SqlAgentTurnStore(engine)
    memories = store.SqlChatMemoryProvider(engine)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from store._engine import make_engine
from store.chat_memory import SqlChatMemory, SqlChatMemoryProvider
from store.crons import CronRecord, CronRecords
from store.idempotency import IdempotencyKeys, IdempotencyRecord, IdempotencyStatus
from store.inbox import Inbox, InboxMessage, InboxStatus
from store.migrations import Migration, SchemaVersionError, check_schema, migrate
from store.sql_lease import SqlTurnLease
from store.threads import ThreadQuery, ThreadRecord, ThreadRecords
from store.turns import SqlAgentTurnStore

# Redis backends are imported on first use, so the SQL backends (the embedded default)
# work where the redis client is not installed.
if TYPE_CHECKING:
    from store.keys import RedisKeys
    from store.redis_events import RedisLiveEvents
    from store.redis_guard import RedisConversationGuard
    from store.redis_lease import RedisTurnLease
    from store.redis_limits import RedisModelLimiter

_LAZY_EXPORTS = {
    "RedisConversationGuard": "store.redis_guard",
    "RedisKeys": "store.keys",
    "RedisLiveEvents": "store.redis_events",
    "RedisTurnLease": "store.redis_lease",
    "RedisModelLimiter": "store.redis_limits",
}


def __getattr__(name: str) -> Any:
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    # SQL backends
    "CronRecord",
    "CronRecords",
    "IdempotencyKeys",
    "IdempotencyRecord",
    "IdempotencyStatus",
    "Inbox",
    "InboxMessage",
    "InboxStatus",
    "SqlAgentTurnStore",
    "SqlChatMemory",
    "SqlChatMemoryProvider",
    "SchemaVersionError",
    "Migration",
    "SqlTurnLease",
    "ThreadQuery",
    "ThreadRecord",
    "ThreadRecords",
    "check_schema",
    "make_engine",
    "migrate",
    # Redis backends
    "RedisConversationGuard",
    "RedisKeys",
    "RedisLiveEvents",
    "RedisModelLimiter",
    "RedisTurnLease",
]
