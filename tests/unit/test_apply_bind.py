"""``bound_query``: the applier's binding gives exactly the text of pymysql's ``cursor.mogrify``."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from pymysql.constants import SERVER_STATUS

from applier.apply.window_applier import bound_query

VALUES: list[Any] = [
    0,
    -1,
    1 << 70,
    -(1 << 63),
    True,
    False,
    None,
    1.5,
    -0.0,
    1e300,
    "",
    "plain",
    'it\'s \\ "quoted"\n\r\x00\x1a',
    "日本語 ✓ \U0001f600",
    "%s %% %(x)s",
    b"\x00\xff'\\",
    bytearray(b"ab"),
    Decimal("-12.3400"),
    datetime.datetime(2026, 11, 25, 13, 0, 1, 5),
    datetime.date(2026, 1, 2),
    datetime.timedelta(hours=-3, seconds=7),
]


@pytest.mark.parametrize("no_backslash_escapes", [False, True])
def test_bound_query_is_mogrify_for_every_kind_of_value(no_backslash_escapes: bool) -> None:
    conn = pymysql.connections.Connection(defer_connect=True, charset="utf8mb4")
    # set by the handshake and by every OK packet; NO_BACKSLASH_ESCAPES changes string escaping
    conn.server_status = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES if no_backslash_escapes else 0
    cur = conn.cursor()
    sql = "REPLACE INTO `t%%` (`a`) VALUES " + ",".join(["(%s)"] * len(VALUES))
    assert bound_query(sql, tuple(VALUES), conn.escape) == cur.mogrify(sql, tuple(VALUES))
