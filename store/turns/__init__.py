"""The SQL turn store: `SqlAgentTurnStore`, in PostgreSQL or SQLite.

Its modules: `columns` (the header columns, defined once), `rows` (snapshots to rows and
back), `queries` (the SQLAlchemy statements), `saves` (`TurnSaves`, and the save in a transaction),
`postgres` and `fast_path` (the PostgreSQL one-statement save and load; a store on PostgreSQL saves
through `fast_path`, which holds the transaction for what one statement cannot do), `cache` (what a
store remembers of the turns it saw) and `store` (the store itself: saves, loads, listings, pruning;
it picks its saves by dialect when it is built).
"""

from __future__ import annotations

from store.turns.store import SqlAgentTurnStore

__all__ = ["SqlAgentTurnStore"]
