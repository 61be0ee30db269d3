"""Several statements in one round trip, each still answering for itself.

Across a network each statement costs a round trip before the next can be sent, whatever its
size: a window of a dozen statements waits a dozen round trips. A session opened with
``multi_statements`` (:func:`applier.downstream.session.connect`) takes several statements,
separated by ``;``, in one COM_QUERY packet; the server runs them in order and answers each in
turn, stopping at the first that fails. So :func:`execute_batch` packs consecutive statements
into packets of at most ``packet_bytes`` and reads the answers one by one: a failing statement is
known by its index (:class:`BatchFailed`), the statements after it were not run, and the caller's
transaction is in the state it would be in had the statements been sent one at a time. On a
session without the capability, the same call sends one statement per round trip.

Only the applier's own statements go through here: values bound by the driver, identifiers
quoted. The upstream DDL text never does, and the sessions that run it are opened without the
capability, so a statement smuggled into a DDL's text cannot run as a second statement.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

import pymysql
from pymysql.constants import CLIENT

from sqlgen.dialect import packet_margin
from sqlgen.dml import bound_bytes

SEPARATOR = ";\n"


class BatchFailed(Exception):
    """Statement ``index`` of a batch failed with ``error``; none after it was run."""

    def __init__(self, index: int, error: pymysql.MySQLError) -> None:
        super().__init__(f"statement {index} of the batch failed: {error}")
        self.index = index
        self.error = error


def multi_statements(conn: pymysql.connections.Connection) -> bool:
    """Whether ``conn`` was opened to take several statements in one packet."""
    return bool(conn.client_flag & CLIENT.MULTI_STATEMENTS)


def packets(texts: Sequence[str], packet_bytes: int) -> Iterator[range]:
    """Runs of consecutive ``texts`` whose joined size stays within ``packet_bytes`` (a larger
    statement goes alone: its own size was checked against the server's limit before)."""
    start, size = 0, 0
    for i, text in enumerate(texts):
        n = bound_bytes(text, packet_bytes) + len(SEPARATOR)
        if i > start and size + n > packet_bytes:
            yield range(start, i)
            start, size = i, 0
        size += n
    if start < len(texts):
        yield range(start, len(texts))


def execute_batch(
    cur: pymysql.cursors.Cursor,
    texts: Sequence[str],
    *,
    fetch: Collection[int] = (),
) -> dict[int, tuple[Any, ...]]:
    """Run ``texts`` (complete statements, values bound) in order on ``cur``'s session, in as few
    packets as the session and its ``max_allowed_packet`` (less the margin every statement
    keeps, ``sqlgen.dialect.packet_margin``) allow; returns the rows of the statements whose
    indexes are in ``fetch``. Raises :class:`BatchFailed` naming the statement the server refused."""
    rows: dict[int, tuple[Any, ...]] = {}
    if not multi_statements(cur.connection):
        for i, text in enumerate(texts):
            try:
                cur.execute(text)
            except pymysql.MySQLError as exc:
                raise BatchFailed(i, exc) from exc
            if i in fetch:
                rows[i] = cur.fetchall()
        return rows
    limit = cur.connection.max_allowed_packet
    for run in packets(texts, limit - packet_margin(limit)):
        i = run.start
        try:
            cur.execute(SEPARATOR.join(texts[run.start : run.stop]) if len(run) > 1 else texts[i])
            while True:
                if i in fetch:
                    rows[i] = cur.fetchall()
                if i + 1 == run.stop:
                    break
                i += 1
                cur.nextset()  # raises the error of statement i, if it failed
        except pymysql.MySQLError as exc:
            raise BatchFailed(i, exc) from exc
    return rows


class Statements:
    """Stands in for a cursor to code that only writes (the checkpoint store's journal and record
    methods): each ``execute`` is bound by ``cur``'s session and kept in ``texts``, to be run
    later with others by :func:`execute_batch`. Code that reads a result cannot be given one."""

    def __init__(self, cur: pymysql.cursors.Cursor) -> None:
        self._cur = cur
        self.texts: list[str] = []

    def execute(self, query: str, args: Any = None) -> None:
        self.texts.append(self._cur.mogrify(query, args))
