"""A small, lossless MySQL lexer for rewriting DDL text.

Why not sqlglot: parsing TiDB DDL and generating it again is not faithful. sqlglot 30 fails on
bare ``AUTO_RANDOM(5)`` and ``TTL = ...`` clauses, and where it does parse it rewrites the rest of
the statement (``KEY`` -> ``INDEX``, ``CHARSET`` -> ``CHARACTER SET``, and it duplicated a
``/*T![clustered_index] CLUSTERED */`` comment). A DDL replayed downstream must stay exactly what
upstream ran, minus the TiDB-only clauses, so :mod:`sqlgen.ddl` edits a token list instead.

The lexer only needs to know where words, strings, quoted identifiers, comments and single
punctuation characters begin and end; joining the ``text`` of all tokens gives back the input
exactly. It never raises: unterminated strings or comments simply run to the end of the input.

MySQL-executable comments (``/*!50100 ... */``, MariaDB's ``/*M!...*/``) are split into an
opening token, their content lexed normally, and a closing token, so rewriting rules see the
clauses inside them (a MySQL 9 server executes ``/*!90000 SHARD_ROW_ID_BITS=4 */``). TiDB's own
``/*T![feature] ... */`` comments are one token: MySQL and MariaDB ignore them.
"""

from __future__ import annotations

from dataclasses import dataclass

WS = "ws"
COMMENT = "comment"
TIDB_COMMENT = "tidb_comment"
EXEC_OPEN = "exec_open"
EXEC_CLOSE = "exec_close"
STRING = "string"
QIDENT = "qident"
WORD = "word"
PUNCT = "punct"

_SPACE = frozenset(" \t\r\n\f\v")
INSIGNIFICANT = frozenset({WS, COMMENT, TIDB_COMMENT, EXEC_OPEN, EXEC_CLOSE})


@dataclass(slots=True)
class Token:
    kind: str
    text: str

    @property
    def upper(self) -> str:
        """Upper-cased text of a WORD (keywords are case-insensitive); '' for other kinds."""
        return self.text.upper() if self.kind == WORD else ""


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c in "_$" or ord(c) >= 0x80


def _find_close(s: str, start: int) -> int:
    """Index just past the ``*/`` at or after ``start``, or len(s)."""
    end = s.find("*/", start)
    return len(s) if end < 0 else end + 2


def _quoted_end(s: str, i: int, q: str, backslash: bool) -> int:
    """Index just past the quoted token starting at ``s[i] == q`` (doubled quote = literal quote)."""
    n = len(s)
    j = i + 1
    while j < n:
        c = s[j]
        if backslash and c == "\\":
            j += 2
            continue
        if c == q:
            if j + 1 < n and s[j + 1] == q:
                j += 2
                continue
            return j + 1
        j += 1
    return n


def tokenize(s: str, *, backslash_escapes: bool = True) -> list[Token]:
    """Tokens of ``s``; ``"".join(t.text for t in tokenize(s)) == s`` always holds.

    ``backslash_escapes=False`` reads strings as a server with ``NO_BACKSLASH_ESCAPES`` does
    (``'\\'`` is a complete string there): :mod:`sqlgen.ddl_guard` reads a text both ways, so
    that no string boundary can hide a clause from it.
    """
    out: list[Token] = []
    n = len(s)
    i = 0
    in_exec = False
    while i < n:
        c = s[i]
        if c in _SPACE:
            j = i + 1
            while j < n and s[j] in _SPACE:
                j += 1
            out.append(Token(WS, s[i:j]))
        elif c == "#" or (c == "-" and s.startswith("--", i) and (i + 2 == n or s[i + 2] in _SPACE)):
            j = s.find("\n", i)
            j = n if j < 0 else j
            out.append(Token(COMMENT, s[i:j]))
        elif c == "/" and s.startswith("/*", i):
            if not in_exec and (s.startswith("/*!", i) or s.startswith("/*M!", i)):
                j = i + (3 if s[i + 2] == "!" else 4)
                while j < n and s[j].isdigit():
                    j += 1
                out.append(Token(EXEC_OPEN, s[i:j]))
                in_exec = True
            elif s.startswith("/*T!", i):
                j = _find_close(s, i + 4)
                out.append(Token(TIDB_COMMENT, s[i:j]))
            else:
                j = _find_close(s, i + 2)
                out.append(Token(COMMENT, s[i:j]))
        elif c == "*" and in_exec and s.startswith("*/", i):
            j = i + 2
            out.append(Token(EXEC_CLOSE, "*/"))
            in_exec = False
        elif c == "'" or c == '"':
            j = _quoted_end(s, i, c, backslash=backslash_escapes)
            out.append(Token(STRING, s[i:j]))
        elif c == "`":
            j = _quoted_end(s, i, c, backslash=False)
            out.append(Token(QIDENT, s[i:j]))
        elif _is_word_char(c):
            j = i + 1
            while j < n and _is_word_char(s[j]):
                j += 1
            out.append(Token(WORD, s[i:j]))
        else:
            j = i + 1
            out.append(Token(PUNCT, c))
        i = j
    return out
