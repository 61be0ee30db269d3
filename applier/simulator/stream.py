"""Turn simulated upstream transactions into the Kafka records a TiCDC changefeed would produce.

What this module reproduces (docs/open-protocol.md §1, §2, §5 and §7):

* a realistic TSO clock (``physical_ms << 18 | logical``), strictly increasing;
* ``CREATE DATABASE`` and one ``CREATE TABLE`` per table first, and an ``ALTER TABLE ... ADD
  COLUMN`` half way (rows after it carry the new column);
* one event per changed row per transaction, updates of a primary key or NOT NULL unique key
  split into a DELETE plus an INSERT with the same commit ts;
* partition dispatch by table or by handle-key value (keyless tables by table);
* row records batching up to ``max_batch_size`` events of one partition (and below
  ``max_message_bytes``), flushed at random moments as TiCDC's time-based flush does;
* resolved events broadcast to every partition, one event per record, only once every row at
  or below them was delivered to its partition;
* at-least-once delivery after simulated restarts: a partition, or all of them, re-sends
  everything after an earlier checkpoint (starting with that older resolved ts, re-batched),
  and now and then a record is sent twice;
* a final resolved ts broadcast that covers everything.

Producer orders that depend on the architecture and the tables (docs/open-protocol.md §5.1-§5.4),
each a :class:`StreamConfig` option; :data:`PRODUCER_MODES` names ready-made combinations:

* ``architecture``: the classic one (TiCDC up to v8.5) sends ``rid`` and writes a DDL only after
  every earlier row of every table; the new one (TiCDC v9) sends no ``rid`` and writes a DDL as
  soon as the tables it blocks have flushed (``ALTER TABLE X``: X; ``CREATE TABLE``: none), so
  rows of other tables with a smaller ts follow it, and a ``CREATE TABLE`` written at once by
  the table trigger dispatcher overtakes an earlier ``ALTER TABLE`` that waits for its table;
* ``partitioned``: a ``PARTITION BY HASH`` table whose four physical partitions are separate
  spans, each holding its rows back and flushing on its own, so one logical table's rows reach a
  Kafka partition out of ts order (every row key carries ``ptn``, the physical partition id);
* ``late_first_copies``: a produced record is lost, newer rows of its spans are delivered, then
  the sink restarts and each of those spans re-sends from its own checkpoint: the first copy of
  a lost row arrives after newer rows of its table ("BAB"), still above the last resolved ts;
* ``ddl_lag``: the mid-stream ``ALTER TABLE X`` is written only just before the next resolved
  broadcast (the latest a producer may): it blocks X alone (in both architectures), so rows of
  other tables with a larger ts reach the partitions before it, while X's newer rows wait for it;
* ``partition_growth``: the producer first uses only half of the topic's partitions (TiCDC keeps
  the partition count it started with, docs/open-protocol.md §5.7): rows, DDLs and resolved
  events go there only, the other partitions stay empty; a third of the way in, it picks up the
  full count and re-hashes, so rows of a key move to another partition while its older versions
  may still be unread on the old one, and the empty partitions start receiving records;
* with replays, also single spans re-created from their own checkpoint, which re-send only their
  part of a transaction's rows (partial first copies).

Large messages (docs/open-protocol.md §9), with ``large_message`` set: a row event larger than
``max_message_bytes`` as TiCDC measures it travels in its record as a claim-check reference (the
full event is stored as an object in :attr:`Simulation.claim_check_objects`, the key names it in
``ccl``) or with its handle-key columns only (``ohk``). A record sent twice carries the same
reference; a restart encodes the event again, which stores it once more under a new name.
``wide_rows`` adds a table whose rows make such events.

The result, a :class:`Simulation`, keeps the records in production order and can tell what the
upstream looked like at any ts, which is what a downstream must converge to.
"""

from __future__ import annotations

from applier.simulator.driver import TsoClock, simulate
from applier.simulator.emitter import partition_of, row_event
from applier.simulator.model import (
    DISPATCHERS,
    PRODUCER_MODES,
    LargeMessage,
    SimEvent,
    SimRecord,
    Simulation,
    StreamConfig,
    format_summary,
)

__all__ = [
    "DISPATCHERS",
    "PRODUCER_MODES",
    "LargeMessage",
    "SimEvent",
    "SimRecord",
    "Simulation",
    "StreamConfig",
    "TsoClock",
    "format_summary",
    "partition_of",
    "row_event",
    "simulate",
]
