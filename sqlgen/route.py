"""Routing: which downstream schema and table an upstream table is written to.

A rule is ``FROM=TO`` (``->`` works as well as ``=``):

- ``FROM`` is ``schema.table`` in TiDB's table-filter pattern syntax, read by the parser the
  ``filter`` rules use (:mod:`sqlgen.table_pattern`): ``*`` any run of characters, ``?`` one
  character, ``[a-z]`` / ``[!a-z]`` character classes, ``\\`` before a character that is not a
  letter or digit makes it literal, a part in backquotes or double quotes is a literal name
  (``"my.db".*``), a ``/regex/`` part matches a substring of the name; other characters than
  letters, digits, ``_``, ``$`` and non-ASCII ones must be escaped or quoted. Matching is
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
from sqlgen.table_pattern import TablePattern, parse_table_pattern, quote_end

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_PLACEHOLDERS = frozenset({"schema", "table"})


class RouteRuleError(ConfigurationError):
    """A route rule that cannot be parsed; the message names the rule and what is wrong."""


class RouteError(FatalError):
    """A routed name that must not be written to (the checkpoint schema) or cannot be formed."""


# -- text of rules and targets (FROM is parsed by sqlgen.table_pattern) --------------------------------

# Characters that end an unquoted FROM table part: the ``=`` or ``->`` before TO, and blanks.
_FROM_ENDS = "=- \t\r\n"
_EXPECTED_RULE = "expected FROM=TO, e.g. 'prod.*=replica.{table}'"
_EXPECTED_NAME = "expected schema.table (quote a name that holds a dot: `my.db`.t)"


def _split_target(text: str) -> tuple[str, str]:
    """A target ``schema.table`` split at the dot outside quotes, brackets and escapes: raw (still
    quoted) parts.

    Raises ValueError when there is not exactly one such dot.
    """
    parts = _split_outside(text, ".", strict=True)
    if len(parts) != 2:
        raise ValueError(_EXPECTED_NAME)
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
            end = quote_end(text, i)
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


def _unquote(part: str) -> str | None:
    """The literal name of a fully quoted part, or None when the part is not quoted."""
    if len(part) >= 2 and part[0] in '`"' and quote_end(part, 0) == len(part):
        q = part[0]
        return part[1:-1].replace(q + q, q)
    return None


def _split_source(text: str) -> tuple[TablePattern, str, str]:
    """``FROM=TO`` (or ``FROM->TO``): the parsed FROM, its text, and the text of TO (ValueError)."""
    if not text or text.startswith(("=", "->")):
        raise ValueError(_EXPECTED_RULE)
    pattern, rest = parse_table_pattern(text, until=_FROM_ENDS)
    source, after = text[: len(text) - len(rest)], rest.lstrip()
    if after.startswith("->"):
        target = after[2:]
    elif after.startswith("="):
        target = after[1:]
    elif not after:
        raise ValueError(_EXPECTED_RULE)
    elif after.startswith("."):
        raise ValueError(_EXPECTED_NAME)
    else:
        raise ValueError(
            f"unexpected {after[0]!r} after the FROM pattern {source!r} (escape a special character "
            "with '\\' or quote the name)"
        )
    if not target.strip():
        raise ValueError(_EXPECTED_RULE)
    return pattern, source, target.strip()


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
    pattern: TablePattern
    target_schema: _Target
    target_table: _Target

    def matches(self, schema: str, table: str) -> bool:
        return self.pattern.matches(schema, table)

    @property
    def whole_schema(self) -> bool:
        """The table pattern is ``*``: the rule routes the schema as a whole (schema-level DDL)."""
        return self.pattern.table.matches_all

    def apply(self, schema: str, table: str) -> tuple[str, str]:
        return self.target_schema.render(schema, table), self.target_table.render(schema, table)

    @property
    def shares_target_schema(self) -> bool:
        """Several upstream schemas land in one target schema (``a_*.* = merged.{table}``)."""
        return not self.pattern.schema.literal and not self.target_schema.uses_schema


def parse_route_rule(text: str) -> RouteRule:
    """Parse ``FROM=TO`` (or ``FROM->TO``); raises RouteRuleError naming the rule."""
    raw = str(text).strip()
    try:
        pattern, source, target = _split_source(raw)
        ts_part, tt_part = _split_target(target)
        rule = RouteRule(
            text=raw,
            source=source,
            target=target,
            pattern=pattern,
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
    """Split at the commas and line breaks between rules. Each FROM is read with the pattern grammar,
    so a comma in its ``/regex/``, class or quoted name stays; its TO runs to the next comma or line
    break outside quotes. A FROM that does not parse runs to the next separator outside quotes and
    brackets, and parse_route_rule then says what is wrong with that rule."""
    rules: list[str] = []
    i = 0
    while i <= len(text):
        try:
            _, rest = parse_table_pattern(text[i:].lstrip(" \t\r"), until=_FROM_ENDS)
            from_end = len(text) - len(rest)
        except ValueError:
            from_end = i
        end = from_end + len(_split_outside(text[from_end:], ",\n", strict=False)[0])
        rules.append(text[i:end].strip())
        i = end + 1
    return rules


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
            if rule.whole_schema and rule.pattern.schema.matches(schema):
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
