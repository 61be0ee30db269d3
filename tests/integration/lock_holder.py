"""Long DDLs in a simulated stream: another session keeps taking a metadata lock on one of the
downstream schema's tables at a time (an open transaction that read it), so a DDL of that table
waits for up to ``hold`` seconds, as a DDL on a big table runs for long. The table's writers are
not held back by the lock itself, only by a DDL waiting behind it."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator

import pymysql


@contextlib.contextmanager
def holding_tables(
    mariadb_params: dict, schema: str, *, seed: int = 0, hold: tuple[float, float] = (0.5, 2.0)
) -> Iterator[list[str]]:
    """Run the holder while the block runs; yields the tables it held (one entry per hold)."""
    stop = threading.Event()
    held: list[str] = []
    rng = random.Random(seed)

    def run() -> None:
        conn = pymysql.connect(**mariadb_params, autocommit=False)
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION lock_wait_timeout = 3")
            while not stop.is_set():
                try:
                    with conn.cursor() as cur:
                        cur.execute(f"SHOW TABLES FROM `{schema}`")
                        tables = [r[0] for r in cur.fetchall()]
                        conn.rollback()
                        if tables:
                            table = rng.choice(tables)
                            cur.execute(f"SELECT 1 FROM `{schema}`.`{table}` LIMIT 1")
                            cur.fetchall()
                            held.append(table)
                            stop.wait(rng.uniform(*hold))
                except pymysql.MySQLError:
                    pass  # dropped meanwhile, or a DDL queued first: try another
                finally:
                    with contextlib.suppress(pymysql.MySQLError):
                        conn.rollback()
                stop.wait(0.05)
        finally:
            conn.close()

    thread = threading.Thread(target=run, name="lock-holder", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join(10)
