"""A write transaction left open in another database of the test server, as a web app sharing the server may leave one.

Such a transaction holds back the server-wide transaction horizon (`pg_snapshot_xmin`) for
every database of the server, ours included, until it ends.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo


@contextmanager
def transaction_open_elsewhere(admin: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """Create a throwaway database, open a transaction there that inserted a row, and yield its connection.

    The transaction stays open until the caller ends it (`commit` or `rollback` on the
    connection) or the block ends; the database is dropped afterwards. `admin` is an
    autocommit connection to the server.
    """
    name = f"agent_runner_other_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with psycopg.connect(make_conninfo(admin.info.dsn, dbname=name)) as other:
            other.execute("CREATE TABLE orders (id serial PRIMARY KEY, note text)")
            other.commit()
            other.execute("INSERT INTO orders (note) VALUES ('left open')")  # the transaction takes an id
            yield other
            other.rollback()
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
