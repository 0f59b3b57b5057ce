"""`pipelined()`: statements executed inside go to PostgreSQL without waiting for the one before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def pipelined() -> Iterator[None]:
    """A psycopg pipeline on the default connection: each statement is sent at once, and each answers when
    its results are fetched, so on two cores the server works while this process builds the next
    statement. A fetch waits for every statement sent before it too (psycopg reads the results in order,
    all of them), so a read whose rows are wanted first goes out alone, and what the server can work on
    meanwhile is sent after its fetch (`snapshot_for_pool`). Row counts and errors are known only once a
    result is fetched or the pipeline has ended: what runs inside defers its checks, and an ORM `update()`
    (which reads its row count at once) must not run inside. Elsewhere (SQLite) a no-op: each statement
    runs when sent."""
    if connection.vendor != "postgresql":
        yield
        return
    connection.ensure_connection()
    # A failed statement raises when the pipeline syncs, as psycopg's error: wrapped as Django's.
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield
