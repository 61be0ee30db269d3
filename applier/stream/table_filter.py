"""Which tables a changefeed replicates: TiDB's table-filter rules, and the stage that drops the rest.

The rules are those of TiDB's tools and of TiCDC's own ``[filter] rules`` (docs/operations.md,
"Table filters"): each rule is ``schema.table``, each part a name or a pattern (``*``, ``?``,
``[a-z]``, ``[!a-z]``, ``\\`` escapes, ``"quoted"`` or ```quoted``` names, ``/regex/``: the
grammar is parsed by :mod:`sqlgen.table_pattern`, which routing shares); a rule starting with
``!`` excludes; blank lines and ``#`` comments are ignored. A table is decided by the **last**
rule that matches it, and a table no rule matches is filtered out. Names compare case-insensitively,
as TiCDC's filter does by default. No rules at all: every table is replicated. Rules that are all
``!`` would filter out every table (TiDB's semantics): refused, with the advice to start with ``*.*``.

The stage (:class:`EventFilter`) runs right after decoding, in the daemon and in the catch-up's
reading tasks, so filtered rows are never cached, spilled, fetched (large messages) or planned.
A record whose events are all filtered out is still fed (with no events): its offset counts as
read, so checkpoints and resume offsets move past it. Resolved events are never filtered.

DDLs:

- schema DDL (``tbl`` empty: CREATE/DROP/ALTER DATABASE) runs when the schema could hold a
  replicated table (TiDB's ``MatchSchema``: the last rule whose schema part matches and that is
  positive, or negative with table part ``*``, decides);
- table DDL runs when its table is replicated; a DDL that moves a table (RENAME, EXCHANGE
  PARTITION) also when the table it moves away from is replicated, so a RENAME of a replicated
  table to a filtered name runs downstream (the table leaves the replicated set, as in TiCDC);
- a DDL that would bring a filtered table's definition or rows into a replicated table (RENAME
  from a filtered to a replicated name, EXCHANGE PARTITION between a filtered and a replicated
  table, CREATE TABLE ... LIKE a filtered table) cannot run downstream, which has no such source:
  it stops the job at that record (:class:`FilteredSourceError`), as TiCDC fails a changefeed on
  the same RENAME. Everything before it is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from applier.codec.events import DDLEvent, Event, LargeMessageEvent, ResolvedEvent, RowEvent
from applier.errors import InputError
from applier.stream.progress import TableKey
from sqlgen.ddl_guard import table_flows
from sqlgen.quoting import quote_ident
from sqlgen.table_pattern import TablePattern, parse_table_pattern

__all__ = ["EventFilter", "FilteredSourceError", "TableFilter", "table_event_filter"]


@dataclass(frozen=True)
class _Rule:
    text: str
    positive: bool
    pattern: TablePattern


def _parse_rule(text: str) -> _Rule | None:
    """One rule, or None for a blank line or a comment; ValueError saying what is wrong."""
    line = text.strip(" \t")
    if not line or line.startswith("#"):
        return None
    positive = not line.startswith("!")
    body = line if positive else line[1:]
    if body.startswith("@"):
        raise ValueError("importing rules from a file (@FILE) is not supported: list the rules instead")
    pattern, rest = parse_table_pattern(body)
    if rest:
        raise ValueError(f"unexpected {rest!r} after the table pattern")
    return _Rule(line, positive, pattern)


class TableFilter:
    """The parsed rules; ``matches_table`` / ``matches_schema`` answer for one name (module docstring).

    Raises ValueError naming the first bad rule. Picklable (the catch-up's tasks get the rules as
    text and parse them again)."""

    def __init__(self, rules: Iterable[str] = ()) -> None:
        self.rules = tuple(str(r) for r in rules)
        parsed: list[_Rule] = []
        for text in self.rules:
            try:
                rule = _parse_rule(text)
            except ValueError as exc:
                raise ValueError(f"rule {text!r}: {exc}") from None
            if rule is not None:
                parsed.append(rule)
        if parsed and not any(r.positive for r in parsed):
            raise ValueError(
                "every rule starts with '!', so no table would be replicated (a table no rule matches is "
                "filtered out); put '*.*' first to replicate every other table"
            )
        self._newest_first = tuple(reversed(parsed))
        self._tables: dict[TableKey, bool] = {}
        self._schemas: dict[str, bool] = {}

    @property
    def active(self) -> bool:
        """False when there are no rules (comments and blank lines only): everything is replicated."""
        return bool(self._newest_first)

    def matches_table(self, schema: str, table: str) -> bool:
        """Is ``schema.table`` replicated? The last rule matching it decides; none: filtered out."""
        key = (schema, table)
        verdict = self._tables.get(key)
        if verdict is None:
            verdict = not self._newest_first
            for rule in self._newest_first:
                if rule.pattern.matches(schema, table):
                    verdict = rule.positive
                    break
            self._tables[key] = verdict
        return verdict

    def matches_schema(self, schema: str) -> bool:
        """Could ``schema`` hold a replicated table? (TiDB's schema rule: a positive rule whose
        schema part matches, or a ``!schema.*`` rule, decides, the last one first.)"""
        verdict = self._schemas.get(schema)
        if verdict is None:
            verdict = not self._newest_first
            for rule in self._newest_first:
                if rule.pattern.schema.matches(schema) and (rule.positive or rule.pattern.table.matches_all):
                    verdict = rule.positive
                    break
            self._schemas[schema] = verdict
        return verdict

    def describe(self) -> list[str]:
        """The effective rules, in order (what ``applier config check`` prints)."""
        return [r.text for r in reversed(self._newest_first)] or ["*.* (no filter: every table)"]

    def __getstate__(self) -> tuple[str, ...]:
        return self.rules

    def __setstate__(self, rules: tuple[str, ...]) -> None:
        self.__init__(rules)  # type: ignore[misc]


class FilteredSourceError(InputError):
    """A DDL would bring a filtered table's definition or rows into a replicated table."""


class EventFilter:
    """The stage: drops the rows and DDLs of filtered tables from one decoded record.

    ``on_skip(schema, table)`` is called the first time a table (``table`` empty: a schema's DDL)
    is filtered out, so the job can say so once.
    """

    def __init__(self, tables: TableFilter, on_skip: Callable[[str, str], None] | None = None) -> None:
        self.tables = tables
        self.on_skip = on_skip
        self.skipped: set[TableKey] = set()

    def keep(self, events: Sequence[Event]) -> Sequence[Event]:
        """The events of replicated tables, in order (``events`` itself when all are kept)."""
        matches = self.tables.matches_table
        kept: list[Event] | None = None
        for i, ev in enumerate(events):
            tp = type(ev)
            if tp is ResolvedEvent:
                keep = True
            elif tp is DDLEvent:
                keep = self._keep_ddl(ev)  # type: ignore[arg-type]
            elif tp is RowEvent or tp is LargeMessageEvent:
                keep = matches(ev.schema, ev.table)  # type: ignore[union-attr]
                if not keep:
                    self.note_skipped(ev.schema, ev.table)  # type: ignore[union-attr]
            else:  # pragma: no cover - the decoder returns nothing else
                raise TypeError(f"not a decoded event: {tp.__name__}")
            if keep:
                if kept is not None:
                    kept.append(ev)
            elif kept is None:
                kept = list(events[:i])
        return events if kept is None else kept

    def note_skipped(self, schema: str, table: str) -> None:
        """``schema.table`` was filtered out (here, or in the catch-up's tasks): say so once."""
        if (schema, table) not in self.skipped:
            self.skipped.add((schema, table))
            if self.on_skip is not None:
                self.on_skip(schema, table)

    def _keep_ddl(self, ddl: DDLEvent) -> bool:
        if not ddl.table:
            keep = self.tables.matches_schema(ddl.schema)
            if not keep:
                self.note_skipped(ddl.schema, "")
            return keep
        matches = self.tables.matches_table
        keep = matches(ddl.schema, ddl.table)
        left_out: list[TableKey] = []
        for flow in table_flows(ddl.query, ddl.schema):
            source, target = matches(*flow.source), matches(*flow.target)
            if target and not source:
                raise FilteredSourceError(_where(ddl) + _into_replicated(flow.source, flow.target))
            keep = keep or (flow.moves and source)
            if flow.moves and not source:
                left_out.append(flow.source)
        if keep and left_out:  # RENAME TABLE a TO b, c TO d with c and d filtered out: not TiCDC's text
            raise FilteredSourceError(
                _where(ddl) + f"the DDL also renames {', '.join(map(_quoted, left_out))}, which the "
                "filter skips: the downstream has no such table; TiCDC writes one event per renamed table"
            )
        if not keep:
            self.note_skipped(ddl.schema, ddl.table)
        return keep


def _where(ddl: DDLEvent) -> str:
    p = ddl.pos
    return (
        f"topic {p.topic!r} partition {p.partition} offset {p.offset} (commit ts {ddl.commit_ts}): "
        f"DDL {ddl.query[:200]!r}: "
    )


def _quoted(table: TableKey) -> str:
    return ".".join(quote_ident(part) for part in table)


def _into_replicated(source: TableKey, target: TableKey) -> str:
    src, dst = _quoted(source), _quoted(target)
    return (
        f"it takes {src}, which the filter skips, into {dst}, which it replicates, and the downstream has "
        f"no {src} to take it from (TiCDC refuses the same DDL for its own filter). Either filter out "
        f"{dst} too (add the rule '!{dst}'), or replicate {src} (load it downstream as of just before "
        'the DDL\'s commit ts, then change the filter); see docs/operations.md, "Table filters"'
    )


def table_event_filter(tables: TableFilter, log: Any) -> EventFilter | None:
    """The stage for a job that logs to ``log`` (a structlog logger), or None without rules: it
    says which rules are in force, then once per table (or schema) that it filters out."""
    if not tables.active:
        return None
    log.info("table filter in force", rules=tables.describe())

    def said(schema: str, table: str) -> None:
        if table:
            log.info(f"table {schema}.{table} filtered out: rows and DDLs skipped")
        else:
            log.info(f"schema {schema} filtered out: its schema DDLs skipped")

    return EventFilter(tables, said)
