"""The SQL turn store: `SqlAgentTurnStore`, in PostgreSQL or SQLite.

Its modules: `columns` (the header columns, defined once), `rows` (snapshots to rows and
back), `queries` (the SQLAlchemy statements), `saves` (the save in a transaction),
`postgres` and `fast_path` (the PostgreSQL one-statement save and load), `cache` (what a
store remembers of the turns it saw) and `store` (the store itself: loads, listings, pruning).
"""

from __future__ import annotations

from store.turns.store import SqlAgentTurnStore

__all__ = ["SqlAgentTurnStore"]
