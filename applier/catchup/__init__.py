"""``applier catchup --from-ts X``: apply a large backlog as a PySpark job, then hand over to ``applier run``.

A downstream restored from a backup taken at TSO X must receive every change committed after X.
The topic holds them, often days of them, and most rows were updated many times: replaying them
event by event is slow. The catch-up reads the backlog in parallel, collapses it to the final
state of every row, writes that state from parallel executors and leaves the daemon's checkpoint
so that ``applier run`` continues exactly where it stopped.

Modules (pyspark is imported only by ``source``, ``session`` and ``job``, and only when the
``catchup`` command runs; ``import applier`` never loads it), in the order a run uses them:

- :mod:`.tso` — ``--from-ts``/``--until`` parsing (TSO integer or ISO-8601 time);
- :mod:`.job` — the driver: one method per stage (plan, scan, window, replay, epochs, hand-off);
- :mod:`.session` — the SparkSession (local mode by default) and what its workers import;
- :mod:`.class_archive` — the driver JVM's class-data archive (a faster start);
- :mod:`.spark_home` — the driver JVM's SPARK_HOME: links to the installed PySpark without its
  zips, so that Spark's planning workers import it compiled too;
- :mod:`.spark_worker` — the Spark tasks' Python worker (PySpark imported from the installation);
- :mod:`.offsets` — start/end offsets (ends learned by fetching), the broker interface;
- :mod:`.ranges` — the offsets cut into ranges, the ranges grouped into tasks;
- :mod:`.source` — the Python Data Source (options, input partitions): what Spark's planning
  workers import;
- :mod:`.scan` — a reading task: reads its ranges with confluent-kafka and decodes them;
- :mod:`._batch_builder` — the readers' compiled loop over decoded events (``_batch_builder.pyx``);
- :mod:`.rows` — decoded events as Arrow columns, and back;
- :mod:`.epochs` — R, the DDLs to run and the epochs between them;
- :mod:`.replay` — the daemon's listener run over a skeleton of the backlog (keyless replays,
  resume offsets);
- :mod:`.tasks` — the functions Spark runs for the writes and checks;
- :mod:`.writer` — executor-side writes with ``sqlgen`` and the daemon's retry rules;
- :mod:`.report` — progress and summary. The CLI is :mod:`applier.commands.catchup`.

The window and the epochs
-------------------------
Rows with ``lower < commit ts <= R`` are applied, ``lower = max(X, checkpoint ts)``, R = the
smallest over partitions of each partition's last resolved ts in the range read. Each DDL with
``lower < D <= R`` splits the window: rows up to D - 1, then the DDL (executed once, on the
driver, with the daemon's rules), then the rows from D on. Per epoch and table, keyed rows are
collapsed per handle key as ``sqlgen.plan_table`` does (commit ts order, deletes before inserts
at equal ts; a writer's rows already one per key are its final states as they are) and written
as multi-row DELETE + REPLACE; keyless rows are replay-filtered by the
daemon's listener and applied in order, not collapsed.

Less data through Spark: collapsing in the readers
--------------------------------------------------
Before the scan, the driver reads the last records of each partition for a resolved ts; the
smallest, B, is at most R. Each reading task then keeps only the last op of every handle key among
its ops at or below B (never across a DDL record it reads), which is what the writers would keep
anyway: picking the last op is associative. Ops above B travel one by one, so no op above R can
hide a key's last op inside the window. If a collapsed row still stands for ops of two epochs
(a stream that sent rows of both sides of a DDL without the DDL between them), the driver sees it
(``lo`` column) and reads the backlog again without collapsing. ``--no-catchup-collapse-in-reader``
turns it off.

Crash safety: a killed catch-up, run again, converges
-----------------------------------------------------
- Keyed tables: an epoch writes final row states, and writing any subset of one epoch's final
  states again (whatever was committed before a crash) converges to the same table. Re-running an
  epoch is therefore harmless, and writers commit every ``max_txn_rows`` rows.
- Keyless tables: inserts are not idempotent, so each keyless table's ops of an epoch are one
  transaction that also moves *that table's* checkpoint (``table_checkpoint``) to the epoch's end
  and first checks it. A re-run skips rows at or below a table's checkpoint, exactly as the daemon
  does, so every keyless epoch is applied once.
- After each epoch the global checkpoint moves to the epoch's end (rows only: no offsets), and a
  DDL is recorded in ``applied_ddl`` in the transaction that moves the checkpoint past it (an
  interrupted DDL is settled from its journal and the catalogue, as in the daemon:
  :mod:`applier.apply.ddl`). A re-run therefore restarts at the first epoch not completed.
- The hand-off is one transaction: global resolved ts R, every table at R, every partition's
  resume offset and resolved ts, the DDLs executed. Running the catch-up again after it is a
  no-op on the data (it resumes from the stored offsets and finds nothing above R).
- The changefeed's single-active lock is held throughout, and every checkpoint write is fenced
  by the claim token: a daemon and a catch-up never write one changefeed at the same time.

Resume offsets
--------------
Per partition, the offset ``applier run`` restarts from: the first record still holding an event
above R (a row or a DDL), moved back to the records that set the listener's replay horizon there,
computed by the daemon's own ``PartitionListener.resume_offset`` (see :mod:`.replay`). The daemon
skips everything at or below R by the checkpoint, so nothing above R is lost and nothing at or
below it is applied twice.
"""
