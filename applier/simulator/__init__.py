"""A TiCDC-faithful Open Protocol stream simulator, and a checker for what reached the downstream.

``applier simulate`` and ``applier demo`` use it to exercise a deployment without TiDB and TiCDC;
the test suite uses it to drive the applier end to end. It is written from the protocol
specification (``docs/open-protocol.md``), never from this project's decoder, so that decoding its
output is an independent check.

Typical use::

    sim = simulate(StreamConfig(seed=7, partitions=4, transactions=300))
    produce_simulation(bootstrap, topic, sim)          # or run_simulate(bootstrap, topic, cfg)
    ...  # run the applier until it has applied sim.final_resolved_ts
    assert compare_downstream(conn, sim, sim.final_resolved_ts) == []

``StreamConfig(**PRODUCER_MODES["all-new"])`` and the other named modes reproduce the orders
real TiCDC producers send (architecture, partitioned tables, late first copies, replays).
``StreamConfig(wide_rows=True, large_message="claim-check")`` adds rows too large for one Kafka
message, sent as claim-check references; ``write_claim_check_objects(sim, directory)`` writes the
objects they name.

Modules: ``tables`` (table definitions and TiCDC column metadata), ``values`` (random values),
``workload`` (the upstream model), ``golang`` and ``encoder`` (the wire format), ``model`` (settings, events,
records, the simulation), ``emitter`` (what the stream reproduces: dispatch, batching, broadcasts,
faults) and ``driver`` (the workload in commit order), ``producer`` (Kafka), ``verify`` (downstream check).
"""

from applier.simulator.driver import simulate
from applier.simulator.model import (
    PRODUCER_MODES,
    LargeMessage,
    SimEvent,
    SimRecord,
    Simulation,
    StreamConfig,
    format_summary,
)
from applier.simulator.producer import (
    ProduceError,
    ensure_topic,
    produce_simulation,
    run_simulate,
    write_claim_check_objects,
)
from applier.simulator.verify import compare_downstream

__all__ = [
    "PRODUCER_MODES",
    "LargeMessage",
    "ProduceError",
    "SimEvent",
    "SimRecord",
    "Simulation",
    "StreamConfig",
    "compare_downstream",
    "ensure_topic",
    "format_summary",
    "produce_simulation",
    "run_simulate",
    "simulate",
    "write_claim_check_objects",
]
