"""What `SqlAgentTurnStore` remembers of the turns it recently saved or loaded: message counts and snapshots.

A save whose expected version is remembered knows which messages are new without reading
the header first, a load reads only the rows added since the remembered history, and the
runner may continue from the remembered snapshot without a load (`CachedSnapshots`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from agent_runner.messages import ModelMessage
from agent_runner.snapshot import AgentTurn

_REMEMBERED_TURNS = 10_000
"""Most turns whose (version, message count) a store keeps."""
_CACHED_HISTORIES = 512
"""Most turns whose messages a store keeps in memory for its next load of them."""
_CACHED_MESSAGES = 50_000
"""Most messages kept in memory over all those turns; a longer history alone is not kept.

A message of a few hundred characters takes about 1 KB as a Python object, so this bounds
the cache near 50 MB for such messages (more for large tool results)."""


class TurnCache:
    """Bounded LRUs of the message counts and the snapshots of recently saved or loaded turns, by turn id.

    The (version, message count) of up to `max_counts` turns: a save over a remembered
    version knows which of its messages are new; its guard still checks the count, so a
    wrong entry costs a retry, never data.

    The snapshots of fewer turns, the newest version seen of each: its message list is a
    history, a message sequence whose leading `count` messages were stored at seq
    0..count-1 under that turn. Turn messages never change once written
    and a save only adds rows, so those messages stay the turn's first `count` messages
    in every later snapshot, whichever process saved it: a load needs only the header and
    the rows from `count` on. The header's `message_count` still decides how long the
    snapshot is, and the load probes the message at `count - 1`, so a history that was
    cut and rewritten by another process (a save with fewer messages) is detected and
    read in full instead.

    Their memory is bounded twice: at most `max_histories` entries and `max_messages`
    messages in all, least recently used dropped first. Terminal turns take no more steps, so their
    entries are dropped rather than kept for a load that rarely comes.
    """

    def __init__(
        self,
        max_histories: int = _CACHED_HISTORIES,
        max_messages: int = _CACHED_MESSAGES,
        max_counts: int = _REMEMBERED_TURNS,
    ) -> None:
        self.max_histories = max_histories
        self.max_messages = max_messages
        self.max_counts = max_counts
        self._counts: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._entries: OrderedDict[str, tuple[AgentTurn, int]] = OrderedDict()
        self._messages = 0
        self._lock = threading.Lock()

    @property
    def history_count(self) -> int:
        """Turns whose history is held."""
        return len(self._entries)

    @property
    def message_count(self) -> int:
        """Messages held over all entries."""
        return self._messages

    def remember(self, turn: AgentTurn) -> None:
        """Remember a snapshot just saved or loaded: its version and message count, and the snapshot.

        A snapshot older than the one held (a read that raced with a save of this store) does
        not replace it.
        """
        with self._lock:
            self._counts[turn.id] = (turn.version, len(turn.messages))
            self._counts.move_to_end(turn.id)
            if len(self._counts) > self.max_counts:
                self._counts.popitem(last=False)
            self._put(turn)

    def count(self, turn_id: str, version: int) -> int | None:
        """The remembered message count of the turn at `version`, or None."""
        with self._lock:
            entry = self._counts.get(turn_id)
        return entry[1] if entry is not None and entry[0] == version else None

    def forget_count(self, turn_id: str) -> None:
        """Drop the turn's remembered count (a save found it wrong)."""
        with self._lock:
            self._counts.pop(turn_id, None)

    def history(self, turn_id: str) -> tuple[list[ModelMessage], int] | None:
        """Return the remembered (messages, count) of the turn, marking it recently used."""
        with self._lock:
            entry = self._entries.get(turn_id)
            if entry is None:
                return None
            self._entries.move_to_end(turn_id)
            return entry[0].messages, entry[1]

    def snapshot(self, turn_id: str) -> AgentTurn | None:
        """The newest snapshot of the turn remembered, or None (terminal turns are not kept)."""
        with self._lock:
            entry = self._entries.get(turn_id)
            if entry is None:
                return None
            self._entries.move_to_end(turn_id)
            return entry[0]

    def _put(self, turn: AgentTurn) -> None:
        # No copy: snapshots and their message lists are immutable.
        count = len(turn.messages)
        held = self._entries.get(turn.id)
        if held is not None and held[0].version > turn.version and held[0].created_at == turn.created_at:
            return  # a read that raced with a newer save (not a turn created again under a pruned one's id)
        self._drop(turn.id)
        if turn.status.is_terminal or count > self.max_messages:
            return
        self._entries[turn.id] = (turn, count)
        self._messages += count
        while len(self._entries) > self.max_histories or self._messages > self.max_messages:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._messages -= evicted

    def _drop(self, turn_id: str) -> None:
        entry = self._entries.pop(turn_id, None)
        if entry is not None:
            self._messages -= entry[1]
