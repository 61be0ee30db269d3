"""TiDB's table-filter pattern grammar: one ``schema.table`` pattern, parsed into name matchers.

The one parser of the grammar, shared by the table filter (``filter`` rules,
applier/stream/table_filter.py) and routing (the ``FROM`` side of ``route`` rules,
:mod:`sqlgen.route`), so both read a pattern alike. It lives in sqlgen because sqlgen imports
nothing of the applier's stages (tests/unit/test_layout.py). The grammar is TiDB's, as its
table-filter parser reads it (docs/operations.md, "Table filters"); each part of ``schema.table`` is

- a plain name of identifier characters (letters, digits, ``_``, ``$``, non-ASCII) with the
  wildcards ``*`` (any run of characters), ``?`` (one character), ``[a-z]`` / ``[!a-z]`` (one
  character in / not in a class) and ``\\`` before a character that is not a letter or digit (that
  character literally); any other character must be escaped or quoted;
- a ``"quoted"`` or ```quoted``` name: literally that name (a doubled quote is one quote);
- a ``/regex/``: matches when the regular expression finds a match **anywhere** in the name.

Names compare case-insensitively, as TiDB compares schema and table names. What a rule around the
pattern means (``!`` in a filter, ``=TO`` in a route) is the caller's: :func:`parse_table_pattern`
returns the text after the pattern.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["NamePattern", "TablePattern", "parse_table_pattern", "quote_end"]

_IDENT_CHARS = re.compile(r"[0-9A-Za-z$_\x80-\U0010ffff]")
_FLAGS = re.IGNORECASE | re.DOTALL
_ANY = ".*"


@dataclass(frozen=True)
class NamePattern:
    """One part (schema or table) of a pattern, compiled."""

    regex: re.Pattern[str]
    search: bool
    """The part is a ``/regex/``: it matches a substring of the name, not the whole name."""
    matches_all: bool
    """The part is ``*`` (or ``**``...): every name."""
    literal: bool
    """The part matches exactly one name (quoted, or no wildcard outside escapes): ``a_*.*`` is not,
    ``shop.*`` is, for its schema part."""

    def matches(self, name: str) -> bool:
        return (self.regex.search(name) if self.search else self.regex.fullmatch(name)) is not None


@dataclass(frozen=True)
class TablePattern:
    """A parsed ``schema.table`` pattern."""

    schema: NamePattern
    table: NamePattern

    def matches(self, schema: str, table: str) -> bool:
        return self.schema.matches(schema) and self.table.matches(table)


def parse_table_pattern(text: str, *, until: str = "") -> tuple[TablePattern, str]:
    """The ``schema.table`` pattern at the start of ``text``, and the text after it.

    Without ``until`` an unquoted part runs to the next ``.`` or the end, and any other special
    character is an error; a character of ``until`` also ends it (``=`` and ``-`` end a route's
    ``FROM``). A quoted or ``/regex/`` table part ends at its closing quote or slash whatever
    follows. Raises ValueError saying what is wrong.
    """
    schema, rest = _name_pattern(text, "schema", until)
    if not rest.startswith("."):
        found = f", found {rest[0]!r}" if rest else ""
        raise ValueError(f"expected '.' between the schema and the table pattern{found}")
    table, rest = _name_pattern(rest[1:], "table", until)
    return TablePattern(schema, table), rest


def quote_end(text: str, i: int) -> int:
    """Index just past the quoted name starting at ``text[i]`` (a doubled quote is a literal one), or -1."""
    q = text[i]
    j = i + 1
    while True:
        j = text.find(q, j)
        if j < 0:
            return -1
        if text[j + 1 : j + 2] != q:
            return j + 1
        j += 2


def _name_pattern(s: str, what: str, until: str) -> tuple[NamePattern, str]:
    """One part at the start of ``s`` (parse_table_pattern), and the text after it."""
    if not s or s[0] == ".":
        raise ValueError(f"missing {what} pattern")
    head = s[0]
    if head == "/":
        i = 1
        while i < len(s) and s[i] != "/":
            i += 2 if s[i] == "\\" else 1
        if i >= len(s) or i == 1:
            raise ValueError(f"the {what} regular expression has no closing '/'")
        return NamePattern(_compile(s[1:i].replace("\\/", "/"), what), True, False, False), s[i + 1 :]
    if head in '"`':
        end = quote_end(s, 0)
        if end < 0:
            raise ValueError(f"the quoted {what} name has no closing {head}")
        name = s[1 : end - 1].replace(head * 2, head)
        if not name:
            raise ValueError(f"empty quoted {what} name")
        return NamePattern(_compile(re.escape(name), what), False, False, True), s[end:]
    out: list[str] = []
    literal = True
    i = 0
    while i < len(s) and s[i] != "." and s[i] not in until:
        c = s[i]
        if c == "\\":
            if i + 1 >= len(s):
                raise ValueError("'\\' at the end of the rule")
            esc = s[i + 1]
            if esc.isascii() and esc.isalnum():
                raise ValueError(f"'\\{esc}': a letter or digit cannot be escaped")
            out.append(re.escape(esc))
            i += 2
            continue
        if c == "*":
            out.append(_ANY)
            i += 1
        elif c == "?":
            out.append(".")
            i += 1
        elif c == "[":
            cls, i = _char_class(s, i)
            out.append(cls)
        elif _IDENT_CHARS.fullmatch(c):
            out.append(re.escape(c))
            i += 1
            continue
        else:
            raise ValueError(f"unexpected special character {c!r} (escape it with '\\' or quote the name)")
        literal = False
    if not out:
        raise ValueError(f"missing {what} pattern")
    matches_all = all(p == _ANY for p in out)
    return NamePattern(_compile("".join(out), what), False, matches_all, literal), s[i:]


def _char_class(s: str, start: int) -> tuple[str, int]:
    """``[...]`` at ``start`` as a regex class, and the index after it. ``[!...]`` negates; ``-``
    makes a range; any other character (``\\``-escaped ones too) stands for itself."""
    i = start + 1
    negate = s[i : i + 1] == "!"
    i += negate
    parts: list[str] = []
    while i < len(s) and s[i] != "]":
        c = s[i]
        if c == "\\":
            esc = s[i + 1 : i + 2]
            if not esc or (esc.isascii() and esc.isalnum()):
                raise ValueError(f"bad escape in the character class {s[start:]!r}")
            parts.append(re.escape(esc))
            i += 2
        else:
            parts.append("-" if c == "-" else re.escape(c))
            i += 1
    if i >= len(s) or not parts:
        raise ValueError(f"unclosed or empty character class {s[start:]!r}")
    return "[" + ("^" if negate else "") + "".join(parts) + "]", i + 1


def _compile(source: str, what: str) -> re.Pattern[str]:
    try:
        return re.compile(source, _FLAGS)
    except re.error as exc:
        raise ValueError(f"bad {what} pattern: {exc}") from None
