"""The message lists of recently saved or loaded turns that `SqlAgentTurnStore` keeps, so a load reads only new rows."""

from __future__ import annotations

import threading
from collections import OrderedDict

from agent_runner.messages import ModelMessage
from agent_runner.snapshot import AgentTurn

_CACHED_HISTORIES = 512
"""Most turns whose messages a store keeps in memory for its next load of them."""
_CACHED_MESSAGES = 50_000
"""Most messages kept in memory over all those turns; a longer history alone is not kept.

A message of a few hundred characters takes about 1 KB as a Python object, so this bounds
the cache near 50 MB for such messages (more for large tool results)."""


class MessageHistories:
    """A bounded LRU of the message lists of recently saved or loaded turns, by turn id.

    Each entry is a message sequence and the count of its leading messages that were
    stored at seq 0..count-1 under that turn. Turn messages never change once written
    and a save only adds rows, so those messages stay the turn's first `count` messages
    in every later snapshot, whichever process saved it: a load needs only the header and
    the rows from `count` on. The header's `message_count` still decides how long the
    snapshot is, and the load probes the message at `count - 1`, so a history that was
    cut and rewritten by another process (a save with fewer messages) is detected and
    read in full instead.

    Memory is bounded twice: at most `max_turns` entries and `max_messages` messages in
    all, least recently used dropped first. Terminal turns take no more steps, so their
    entries are dropped rather than kept for a load that rarely comes.
    """

    def __init__(self, max_turns: int = _CACHED_HISTORIES, max_messages: int = _CACHED_MESSAGES) -> None:
        self.max_turns = max_turns
        self.max_messages = max_messages
        self._entries: OrderedDict[str, tuple[list[ModelMessage], int]] = OrderedDict()
        self._messages = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def message_count(self) -> int:
        """Messages held over all entries."""
        return self._messages

    def get(self, turn_id: str) -> tuple[list[ModelMessage], int] | None:
        """Return the remembered (messages, count) of the turn, marking it recently used."""
        with self._lock:
            entry = self._entries.get(turn_id)
            if entry is not None:
                self._entries.move_to_end(turn_id)
            return entry

    def put(self, turn: AgentTurn) -> None:
        """Remember the turn's messages (no copy: snapshots and their message lists are immutable)."""
        count = len(turn.messages)
        with self._lock:
            self._drop(turn.id)
            if turn.status.is_terminal or count > self.max_messages:
                return
            self._entries[turn.id] = (turn.messages, count)
            self._messages += count
            while len(self._entries) > self.max_turns or self._messages > self.max_messages:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._messages -= evicted

    def _drop(self, turn_id: str) -> None:
        entry = self._entries.pop(turn_id, None)
        if entry is not None:
            self._messages -= entry[1]
