"""``applier decode``: read a topic to its end and summarise the decoded events.

Useful to check that a changefeed's topic is readable with the configured options (legacy
strings, compression) before pointing the daemon at a database.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.events import DDLEvent, LargeMessageEvent, ResolvedEvent, RowEvent
from applier.errors import EXIT_OK, FatalError
from applier.kafka.reader import PartitionReader, Record, read_all
from applier.ops.logs import configure


@dataclass
class StreamSummary:
    records: int = 0
    rows: Counter = field(default_factory=Counter)  # (schema.table, kind) -> count
    ddls: list[tuple[int, str, str]] = field(default_factory=list)  # (ts, schema, query), unique
    resolved_by_partition: dict[int, int] = field(default_factory=dict)
    large_messages: int = 0

    @property
    def global_resolved(self) -> int:
        return min(self.resolved_by_partition.values(), default=0)

    def add(self, partition: int, events: list) -> None:
        self.records += 1
        for ev in events:
            if isinstance(ev, RowEvent):
                self.rows[(f"{ev.schema}.{ev.table}", ev.kind.name.lower())] += 1
            elif isinstance(ev, ResolvedEvent):
                if ev.ts > self.resolved_by_partition.get(partition, 0):
                    self.resolved_by_partition[partition] = ev.ts
            elif isinstance(ev, DDLEvent):
                item = (ev.commit_ts, ev.schema, ev.query)
                if item not in self.ddls:
                    self.ddls.append(item)
            elif isinstance(ev, LargeMessageEvent):
                self.large_messages += 1

    def render(self) -> str:
        lines = [f"records: {self.records}"]
        total = sum(self.rows.values())
        lines.append(f"row events: {total}")
        for (table, kind), n in sorted(self.rows.items()):
            lines.append(f"  {table:<40} {kind:<7} {n}")
        lines.append(f"DDL events (distinct): {len(self.ddls)}")
        for ts, schema, query in sorted(self.ddls):
            q = " ".join(query.split())
            lines.append(f"  ts={ts} schema={schema or '-'}: {q[:100]}{'...' if len(q) > 100 else ''}")
        if self.large_messages:
            lines.append(f"large-message (ohk/ccl) events: {self.large_messages}")
        for p, ts in sorted(self.resolved_by_partition.items()):
            lines.append(f"resolved ts partition {p}: {ts}")
        lines.append(f"global resolved ts: {self.global_resolved}")
        return "\n".join(lines)


def summarise(records: list[Record], topic: str, options: DecoderOptions) -> StreamSummary:
    summary = StreamSummary()
    for rec in records:
        summary.add(
            rec.partition,
            decode_record(
                rec.key,
                rec.value,
                topic=rec.topic or topic,
                partition=rec.partition if rec.kafka_partition < 0 else rec.kafka_partition,
                offset=rec.offset,
                options=options,
            ),
        )
    return summary


def run_decode(cfg) -> int:
    configure(cfg.log_format, cfg.log_level)  # librdkafka's messages, on stderr (the summary is stdout)
    reader = PartitionReader(cfg.kafka_bootstrap, cfg.topics(), "applier-decode", cfg.kafka_config)
    try:
        partitions = reader.discover_partitions()
        records = read_all(reader, dict.fromkeys(partitions, "earliest"))
        summary = summarise(records, cfg.topic, cfg.decoder_options())
    except FatalError as exc:
        print(f"applier: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        reader.close()
    print(summary.render())
    return EXIT_OK
