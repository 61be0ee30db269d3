"""Produce a simulated stream into Kafka, record for record, partition for partition.

The records already encode the simulated faults (replays, duplicates), so the Kafka producer
itself must add none: it runs idempotent (no duplicates or reordering from its own retries), sends
each record to the partition the simulation chose, and fails loudly if any record is not
acknowledged - a half-produced stream would make every later check meaningless.

The claim-check objects of large events go to a directory (:func:`write_claim_check_objects`),
where TiCDC's external storage would hold them; tests upload them elsewhere themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from applier.errors import FatalError
from applier.simulator.driver import simulate
from applier.simulator.model import SimRecord, Simulation, StreamConfig

_PRODUCER_HEADROOM = 64 * 1024  # protocol overhead on top of a record's key and value


class ProduceError(FatalError):
    """Some records were not acknowledged by the broker; the topic holds an incomplete stream."""


def ensure_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 15.0) -> None:
    """Create ``topic`` with ``partitions`` partitions unless it exists; refuse a smaller one.

    Lists all topics rather than asking for this one, because a metadata request for a single
    missing topic can make a broker with auto-creation enabled create it with its own defaults.
    """
    from confluent_kafka.admin import AdminClient

    from applier.kafka.client_log import KafkaClientLog
    from applier.kafka.embedded_broker import create_topic

    admin = AdminClient(KafkaClientLog().install({"bootstrap.servers": bootstrap}))
    metadata = admin.list_topics(timeout=timeout)
    existing = metadata.topics.get(topic)
    if existing is None or (existing.error is not None and not existing.partitions):
        create_topic(bootstrap, topic, partitions, timeout=timeout)
        return
    if len(existing.partitions) < partitions:
        raise ProduceError(
            f"topic {topic!r} has {len(existing.partitions)} partitions, the simulation needs {partitions}"
        )


def produce_records(
    bootstrap: str,
    topic: str,
    records: Iterable[SimRecord],
    *,
    place: Callable[[int], tuple[str, int]] | None = None,
    max_message_bytes: int = 1 << 20,
    timeout: float = 60.0,
    extra_config: dict | None = None,
) -> int:
    """Send ``records`` in order with an idempotent producer; returns how many were sent.

    ``place`` maps a record's ``partition`` to its topic and partition (a topic dispatcher's
    simulation: ``Simulation.topic_of``); by default every record goes to ``topic``.

    Raises :class:`ProduceError` when any delivery fails or the flush times out.
    """
    from confluent_kafka import KafkaException, Producer

    from applier.kafka.client_log import KafkaClientLog

    conf = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.max.bytes": max_message_bytes + _PRODUCER_HEADROOM,
        "compression.type": "none",  # the simulation decides what is compressed, not librdkafka
    }
    conf.update(extra_config or {})
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(f"topic {msg.topic()} partition {msg.partition()}: {err}")

    producer = Producer(KafkaClientLog().install(conf))
    sent = 0
    try:
        rows_unacked = False
        for rec in records:
            to, partition = (topic, rec.partition) if place is None else place(rec.partition)
            if place is not None:
                # TiCDC writes a resolved ts or a DDL only once the rows before it were acknowledged
                # on every partition of every topic: with several topics nothing else orders a
                # quiet topic's rows before a resolved event of another (docs/open-protocol.md §5.10).
                # One topic needs no wait: each partition gets the event after its own rows.
                if rows_unacked and any(ev.kind != "row" for ev in rec.events):
                    _flush(producer, timeout, sent, topic)
                    rows_unacked = False
                rows_unacked = rows_unacked or any(ev.kind == "row" for ev in rec.events)
            while True:
                try:
                    producer.produce(
                        to, key=rec.key, value=rec.value, partition=partition, on_delivery=on_delivery
                    )
                    break
                except BufferError:
                    producer.poll(0.1)  # local queue full: let deliveries drain, then retry
            sent += 1
            producer.poll(0)
        _flush(producer, timeout, sent, topic)
    except KafkaException as exc:
        raise ProduceError(f"producing to {topic!r} failed: {exc}") from exc
    if errors:
        shown = "; ".join(errors[:5])
        raise ProduceError(f"{len(errors)} of {sent} records to {topic!r} failed: {shown}")
    return sent


def simulation_topics(sim: Simulation, topic: str) -> list[str]:
    """The topics ``sim`` writes to with ``topic`` as the default one: ``topic`` itself, and with
    the topic dispatcher the table topics that get records (TiCDC creates them on first use)."""
    used = {sim.topic_of(rec.partition, topic)[0] for rec in sim.records}
    return [topic, *sorted(used - {topic})]


def _flush(producer: Any, timeout: float, sent: int, topic: str) -> None:
    remaining = producer.flush(timeout)
    if remaining:
        raise ProduceError(
            f"{remaining} of {sent} records to {topic!r} were not acknowledged within {timeout}s"
        )


def produce_simulation(bootstrap: str, topic: str, sim: Simulation, *, create: bool = True) -> int:
    """Produce every record of ``sim`` to ``topic`` (created with the right partition count), or
    with the topic dispatcher to ``topic`` and the table topics (``simulation_topics``)."""
    if create:
        for name in simulation_topics(sim, topic):
            ensure_topic(bootstrap, name, sim.config.partitions)
    place = (lambda slot: sim.topic_of(slot, topic)) if sim.table_topics else None
    return produce_records(
        bootstrap, topic, sim.records, max_message_bytes=sim.config.max_message_bytes, place=place
    )


def run_simulate(bootstrap: str, topic: str, cfg: StreamConfig) -> Simulation:
    """``applier simulate``: build the stream for ``cfg`` and produce it to ``topic``."""
    sim = simulate(cfg)
    produce_simulation(bootstrap, topic, sim)
    return sim


def write_claim_check_objects(sim: Simulation, directory: str | Path) -> int:
    """Write every claim-check object of ``sim`` as ``directory/<name>`` (the directory is
    created if missing); returns how many. A consumer finds them there by the base name of a
    reference's ``ccl``, whatever storage URI the producer wrote in it."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for name, data in sim.claim_check_objects.items():
        (root / name).write_bytes(data)
    return len(sim.claim_check_objects)
