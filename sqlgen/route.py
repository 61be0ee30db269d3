"""Routing: which downstream schema and table an upstream table is written to.

A rule is ``FROM=TO`` (``->`` works as well as ``=``):

- ``FROM`` is ``schema.table`` in TiDB's table-filter wildcard syntax (``*`` any run of characters,
  ``?`` one character, ``[a-z]`` / ``[!a-z]`` character classes, ``\\`` escapes the next
  character); a part in backquotes or double quotes is a literal name (``"my.db".*``). Matching is
  case-insensitive, as TiDB compares schema and table names.
- ``TO`` is ``schema.table`` made of literal text and the placeholders ``{schema}`` and ``{table}``
  (the upstream names, in their own case); a part that is just ``*`` keeps the upstream name, so
  ``src.* = dst.*`` renames the schema only. ``{table}`` may not appear in the target schema: a
  schema-level DDL (``CREATE DATABASE``) has no table to fill it with.

Rules are tried in the order given and the **first** matching rule wins (as TiCDC's own sink
routing, ``sink.dispatchers`` with a target schema or table, does); a table no rule matches keeps
its names. Examples: ``prod.* = replica.{table}``, ``db.tbl = db2.tbl2``,
``*.* = {schema}_bak.{table}``.

Only the names written downstream change: checkpoint keys (applied DDLs, table floors) stay the
upstream names, so changing the rules later does not lose the place in the stream.

A schema-level DDL (``CREATE/DROP/ALTER DATABASE s``) is routed by the first rule whose schema
pattern matches ``s`` and whose table pattern is ``*``; without one, the schema keeps its name.
When that rule's target schema is shared by several upstream schemas (a wildcard schema pattern and
a target schema without ``{schema}``), ``DROP DATABASE`` is not run: it would drop the other
schemas' tables too (:meth:`Router.ddl_skip_reason`). docs/operations.md ("Routing") has the
details, and :mod:`sqlgen.ddl_route` how the text of a DDL is rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from applier.errors import ConfigurationError, FatalError

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_PLACEHOLDERS = frozenset({"schema", "table"})


class RouteRuleError(ConfigurationError, ValueError):
    """A route rule that cannot be parsed; the message names the rule and what is wrong."""


class RouteError(FatalError, RuntimeError):
    """A routed name that must not be written to (the checkpoint schema) or cannot be formed."""


# -- TiDB table-filter wildcard patterns -------------------------------------------------------------


def split_table_pattern(text: str) -> tuple[str, str]:
    """``schema.table`` split at the dot outside quotes, brackets and escapes: raw (still quoted) parts.

    Raises ValueError when there is not exactly one such dot.
    """
    parts = _split_outside(text, ".", strict=True)
    if len(parts) != 2:
        raise ValueError("expected schema.table (quote a name that holds a dot: `my.db`.t)")
    return parts[0].strip(), parts[1].strip()


def _split_outside(text: str, separators: str, *, strict: bool) -> list[str]:
    """``text`` split at the ``separators`` that stand outside quotes, ``[...]`` classes and ``\\``
    escapes. ``strict``: an unterminated quote or class is a ValueError (else it runs to the end)."""
    parts: list[str] = []
    start = 0
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        end = -2
        if c in '`"':
            end = _quote_end(text, i)
        elif c == "[":
            end = text.find("]", i + 2)  # ``[]...]`` holds a literal ]
            end = end + 1 if end >= 0 else -1
        if end == -1:
            if strict:
                raise ValueError(f"unterminated {'[ character class' if c == '[' else c + ' quote'}")
            end = n
        if end >= 0:
            i = end
            continue
        if c in separators:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _quote_end(text: str, i: int) -> int:
    """Index just past the quoted name starting at ``text[i]`` (a doubled quote is a literal one), or -1."""
    q = text[i]
    j = i + 1
    while j < len(text):
        if text[j] == q:
            if j + 1 < len(text) and text[j + 1] == q:
                j += 2
                continue
            return j + 1
        j += 1
    return -1


def _unquote(part: str) -> str | None:
    """The literal name of a fully quoted part, or None when the part is not quoted."""
    if len(part) >= 2 and part[0] in '`"' and _quote_end(part, 0) == len(part):
        q = part[0]
        return part[1:-1].replace(q + q, q)
    return None


def compile_name_pattern(part: str) -> re.Pattern[str]:
    """A case-insensitive regex matching whole names for one part of a table-filter pattern."""
    literal = _unquote(part)
    if literal is not None:
        return re.compile(re.escape(literal), re.IGNORECASE)
    if not part:
        raise ValueError("empty name pattern")
    out: list[str] = []
    i = 0
    while i < len(part):
        c = part[i]
        if c == "\\":
            if i + 1 >= len(part):
                raise ValueError("a trailing \\ escapes nothing")
            out.append(re.escape(part[i + 1]))
            i += 2
        elif c == "*":
            out.append(".*")
            i += 1
        elif c == "?":
            out.append(".")
            i += 1
        elif c == "[":
            end = part.find("]", i + 2)
            if end < 0:
                raise ValueError("unterminated [ character class")
            body = part[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            if not body:
                raise ValueError("empty character class")
            body = body.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
            out.append("[" + ("^" if negate else "") + body + "]")
            i = end + 1
        elif c in '`"':
            raise ValueError(f"a quoted name must be the whole part: {part!r}")
        else:
            out.append(re.escape(c))
            i += 1
    try:
        return re.compile("".join(out), re.IGNORECASE | re.DOTALL)
    except re.error as exc:
        raise ValueError(f"bad pattern {part!r}: {exc}") from None


def _is_literal(part: str) -> bool:
    """Whether a pattern part matches exactly one name (no wildcard outside quotes and escapes)."""
    if _unquote(part) is not None:
        return True
    i = 0
    while i < len(part):
        if part[i] == "\\":
            i += 2
            continue
        if part[i] in "*?[":
            return False
        i += 1
    return True


# -- rules -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """One side of a target (``{schema}_bak``): literal text and placeholders, rendered per table."""

    template: str

    @classmethod
    def parse(cls, part: str, *, allow_table: bool) -> _Target:
        literal = _unquote(part)
        if literal is not None:
            return cls(literal.replace("{", "{{").replace("}", "}}"))
        if part == "*":
            return cls("{table}" if allow_table else "{schema}")
        if not part:
            raise ValueError("empty target name")
        for name in _PLACEHOLDER.findall(part):
            if name not in _PLACEHOLDERS:
                raise ValueError(f"unknown placeholder {{{name}}} (use {{schema}} or {{table}})")
            if name == "table" and not allow_table:
                raise ValueError("{table} may only appear in the target table")
        stray = _PLACEHOLDER.sub("", part)
        if "{" in stray or "}" in stray:
            raise ValueError(f"unbalanced brace in {part!r}")
        if any(c in stray for c in '*?[`"'):
            raise ValueError(f"the target {part!r} may hold only text, {{schema}} and {{table}}")
        return cls(part)

    @property
    def uses_schema(self) -> bool:
        return "{schema}" in self.template

    def render(self, schema: str, table: str) -> str:
        return self.template.format(schema=schema, table=table)


@dataclass(frozen=True)
class RouteRule:
    """One parsed ``FROM=TO`` rule; ``text`` is the rule as given, for messages."""

    text: str
    source: str
    target: str
    schema_pattern: re.Pattern[str]
    table_pattern: re.Pattern[str]
    schema_literal: bool
    whole_schema: bool
    """The table pattern is ``*``: the rule routes the schema as a whole (schema-level DDL)."""
    target_schema: _Target
    target_table: _Target

    def matches(self, schema: str, table: str) -> bool:
        return bool(self.schema_pattern.fullmatch(schema) and self.table_pattern.fullmatch(table))

    def apply(self, schema: str, table: str) -> tuple[str, str]:
        return self.target_schema.render(schema, table), self.target_table.render(schema, table)

    @property
    def shares_target_schema(self) -> bool:
        """Several upstream schemas land in one target schema (``a_*.* = merged.{table}``)."""
        return not self.schema_literal and not self.target_schema.uses_schema


def parse_route_rule(text: str) -> RouteRule:
    """Parse ``FROM=TO`` (or ``FROM->TO``); raises RouteRuleError naming the rule."""
    raw = str(text).strip()
    try:
        if "->" in raw:
            source, _, target = raw.partition("->")
        else:
            source, sep, target = raw.partition("=")
            if not sep:
                raise ValueError("expected FROM=TO, e.g. 'prod.*=replica.{table}'")
        source, target = source.strip(), target.strip()
        if not source or not target:
            raise ValueError("expected FROM=TO, e.g. 'prod.*=replica.{table}'")
        s_part, t_part = split_table_pattern(source)
        ts_part, tt_part = split_table_pattern(target)
        rule = RouteRule(
            text=raw,
            source=source,
            target=target,
            schema_pattern=compile_name_pattern(s_part),
            table_pattern=compile_name_pattern(t_part),
            schema_literal=_is_literal(s_part),
            whole_schema=t_part == "*",
            target_schema=_Target.parse(ts_part, allow_table=False),
            target_table=_Target.parse(tt_part, allow_table=True),
        )
    except ValueError as exc:
        raise RouteRuleError(f"route rule {raw!r}: {exc}") from None
    return rule


def rule_texts(raw: str | Iterable[str] | Mapping[str, str] | Iterable[Mapping[str, str]]) -> list[str]:
    """The rules of a setting as ``FROM=TO`` strings, in order.

    Accepted: one string (rules separated by commas or line breaks outside brackets and quotes, as
    in ``APPLIER_ROUTE``), a list of strings (``--route`` repeated, a TOML list), a table mapping
    FROM to TO (TOML ``[route]``, in file order) or a list of tables with ``from`` and ``to``
    (TOML ``[[route]]``).
    """
    if isinstance(raw, str):
        return [r for r in _split_rules(raw) if r.strip()]
    if isinstance(raw, Mapping):
        return [f"{k}={v}" for k, v in raw.items()]
    out: list[str] = []
    for item in raw:
        if isinstance(item, Mapping):
            unknown = set(item) - {"from", "to"}
            if unknown or "from" not in item or "to" not in item:
                raise RouteRuleError(f"route rule {dict(item)!r}: expected a table with 'from' and 'to'")
            out.append(f"{item['from']}={item['to']}")
        else:
            out.extend(r for r in _split_rules(str(item)) if r.strip())
    return out


def _split_rules(text: str) -> list[str]:
    """Split at commas and line breaks that are outside brackets and quotes."""
    return [part.strip() for part in _split_outside(text, ",\n", strict=False)]


# -- the router --------------------------------------------------------------------------------------


@dataclass
class Router:
    """The rules of one changefeed: upstream (schema, table) -> downstream names.

    Pure data (picklable into Spark tasks). ``reserved_schemas`` (the checkpoint schema) may never
    be a target: a name routed there raises RouteError.
    """

    rules: tuple[RouteRule, ...] = ()
    reserved_schemas: frozenset[str] = frozenset()
    _tables: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_rules(cls, texts: Iterable[str], reserved_schemas: Iterable[str] = ()) -> Router:
        """Parse ``texts``; a rule whose literal target schema is reserved is refused at once."""
        router = cls(
            tuple(parse_route_rule(t) for t in texts), frozenset(s.lower() for s in reserved_schemas)
        )
        for rule in router.rules:
            template = rule.target_schema.template
            if "{" not in template and template.lower() in router.reserved_schemas:
                raise RouteRuleError(
                    f"route rule {rule.text!r}: {template} is the applier's checkpoint schema"
                )
        return router

    def __bool__(self) -> bool:
        return bool(self.rules)

    def describe(self) -> list[dict[str, str]]:
        """The rules in the order they are tried, for ``applier config check`` and the start log."""
        return [{"from": r.source, "to": r.target} for r in self.rules]

    def rule_for(self, schema: str, table: str) -> RouteRule | None:
        for rule in self.rules:
            if rule.matches(schema, table):
                return rule
        return None

    def table(self, schema: str, table: str) -> tuple[str, str]:
        """Downstream (schema, table) of an upstream table."""
        key = (schema, table)
        routed = self._tables.get(key)
        if routed is None:
            rule = self.rule_for(schema, table)
            routed = key if rule is None else rule.apply(schema, table)
            self._check(routed[0], rule, f"{schema}.{table}")
            if rule is not None and not (routed[0] and routed[1]):
                raise RouteError(f"route rule {rule.text!r} gives an empty name for {schema}.{table}")
            self._tables[key] = routed
        return routed

    def schema_rule(self, schema: str) -> RouteRule | None:
        """The rule a schema-level DDL of ``schema`` follows: the first whose table pattern is ``*``."""
        for rule in self.rules:
            if rule.whole_schema and rule.schema_pattern.fullmatch(schema):
                return rule
        return None

    def schema(self, schema: str) -> str:
        """Downstream name of an upstream schema as a whole (CREATE/DROP/ALTER DATABASE)."""
        rule = self.schema_rule(schema)
        target = schema if rule is None else rule.target_schema.render(schema, "")
        self._check(target, rule, schema)
        return target

    def ddl_skip_reason(self, schema: str, drop_schema: bool) -> str:
        """Why a schema-level DDL must not run downstream ('' when it may): only a DROP DATABASE
        into a target schema that other upstream schemas share."""
        rule = self.schema_rule(schema)
        if drop_schema and rule is not None and rule.shares_target_schema:
            return (
                f"DROP DATABASE {schema} is routed by {rule.text!r} into {self.schema(schema)}, which other "
                "upstream schemas share: not dropped (its tables stay downstream)"
            )
        return ""

    def _check(self, target: str, rule: RouteRule | None, what: str) -> None:
        if rule is not None and target.lower() in self.reserved_schemas:
            raise RouteError(
                f"route rule {rule.text!r} sends {what} into {target}, the applier's checkpoint schema"
            )
