"""DDL rules (sqlgen.ddl), the lossless lexer (sqlgen.sqltokens) and error classes (sqlgen.errors)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlgen import (
    MARIADB,
    MYSQL,
    TIDB,
    TRANSIENT_ERRORS,
    ErrorClass,
    classify_ddl_error,
    plan_ddl,
    translate_ddl,
)
from sqlgen.sqltokens import EXEC_CLOSE, EXEC_OPEN, QIDENT, STRING, TIDB_COMMENT, tokenize
from tests.builders import sql_fixture_cases

# The translations, input and expected statement: tests/fixtures/sqlgen/ddl_translate.sql.
TRANSLATIONS = sql_fixture_cases("sqlgen/ddl_translate.sql")

# Statements that only look like TiDB clauses (names, comments, strings) or have none, blank ones included.
UNCHANGED = [
    "CREATE TABLE t (ttl INT, clustered INT, auto_random BIGINT, shard_row_id_bits INT, placement INT, "
    "policy INT, PRIMARY KEY (auto_random, clustered), KEY clustered (ttl))",
    "ALTER TABLE t ADD COLUMN ttl INT, DROP COLUMN auto_random, CHANGE clustered nonclustered INT",
    "ALTER TABLE t RENAME COLUMN ttl TO pre_split_regions",
    "ALTER TABLE t CHANGE placement policy INT, CHANGE COLUMN ttl_enable ttl_job_interval INT",
    "ALTER TABLE t ADD INDEX auto_random (a), DROP remove, ADD COLUMN (auto_random BIGINT)",
    "ALTER TABLE t ADD UNIQUE KEY auto_random (a), ADD KEY auto_random2 (b), CHANGE x auto_random BIGINT",
    "CREATE VIEW v AS SELECT ttl, shard_row_id_bits FROM t WHERE ttl = 1",
    "CREATE TABLE t (a INT COMMENT 'AUTO_RANDOM(5) SHARD_ROW_ID_BITS=4 /*T! x */') "
    "COMMENT='TTL = a + INTERVAL 1 DAY'",
    "CREATE TABLE `SHARD_ROW_ID_BITS` (`TTL` INT, `CLUSTERED` INT, PRIMARY KEY (`CLUSTERED`))",
    "CREATE TABLE t (a INT) /* keep me */ -- and me\n ENGINE=InnoDB # me too",
    "CREATE TABLE t (a INT PRIMARY KEY, b INT, c INT AS (a + b) STORED)",
    "DROP TABLE IF EXISTS `a``b`",
    "RENAME TABLE a TO b",
    "CREATE TABLE global (global INT, KEY global (global))",
    "CREATE GLOBAL TEMPORARY TABLE t (a INT) ON COMMIT DELETE ROWS",
    "",
    "   ",
]


@pytest.mark.parametrize(("query", "expected"), TRANSLATIONS)
def test_translate_removes_tidb_clauses(query: str, expected: str) -> None:
    assert translate_ddl(query, MARIADB) == expected
    assert translate_ddl(query, MYSQL) == expected
    assert translate_ddl(query, TIDB) == query


@pytest.mark.parametrize("query", UNCHANGED)
def test_translate_leaves_other_text_alone(query: str) -> None:
    assert translate_ddl(query, MARIADB) == query


def test_tokenizer_kinds() -> None:
    toks = tokenize("a 'it''s \\' x' `b``c` /*T! t */ /*!50100 x */ \"q\"")
    kinds = [t.kind for t in toks if t.kind not in ("ws",)]
    assert kinds == ["word", STRING, QIDENT, TIDB_COMMENT, EXEC_OPEN, "word", EXEC_CLOSE, STRING]
    assert toks[2].text == "'it''s \\' x'"
    assert tokenize("'unterminated")[0].text == "'unterminated"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "CREATE",
                    "ALTER",
                    "TABLE",
                    "DATABASE",
                    " ",
                    "(",
                    ")",
                    ",",
                    "=",
                    "+",
                    ".",
                    "'",
                    '"',
                    "`",
                    "/*",
                    "*/",
                    "/*!",
                    "/*T!",
                    "--",
                    "#",
                    "\n",
                    "AUTO_RANDOM",
                    "CLUSTERED",
                    "PRIMARY",
                    "KEY",
                    "TTL",
                    "INTERVAL",
                    "DAY",
                    "PLACEMENT",
                    "POLICY",
                    "DEFAULT",
                    "SHARD_ROW_ID_BITS",
                    "REMOVE",
                    "4",
                    "\\",
                ]
            ),
            st.text(max_size=3),
        ),
        max_size=30,
    )
)
def test_lexer_is_lossless_and_translation_never_raises(parts: list[str]) -> None:
    text = "".join(parts)
    assert "".join(t.text for t in tokenize(text)) == text
    out = translate_ddl(text, MARIADB)
    assert isinstance(out, str)
    assert len(out) <= len(text) + text.count("*/") + 1  # only removes (plus a separating space)


def test_plan_ddl_rules() -> None:
    for skipped in (13, 16, 27, 28, 29, 30, 31, 40, 51, 56):
        p = plan_ddl("ALTER TABLE t SOMETHING", skipped, "s", MARIADB)
        assert not p.execute and p.statements() == [] and "outside TiDB" in p.reason
    p = plan_ddl("CREATE DATABASE `x`", 1, "x", MARIADB)
    assert p.execute and p.use_schema is None and p.statements() == ["CREATE DATABASE `x`"]
    p = plan_ddl("DROP DATABASE x", 2, "x", MARIADB)
    assert p.statements() == ["DROP DATABASE x"]
    p = plan_ddl("ALTER DATABASE x CHARACTER SET utf8mb4", 26, "x", MARIADB)
    assert p.use_schema is None
    p = plan_ddl("CREATE TABLE t (id BIGINT AUTO_RANDOM PRIMARY KEY)", 3, "we`ird", MARIADB)
    assert p.statements() == ["USE `we``ird`", "CREATE TABLE t (id BIGINT PRIMARY KEY)"]
    p = plan_ddl("ALTER TABLE t ADD COLUMN c INT", 5, "s", TIDB)
    assert p.statements() == ["USE `s`", "ALTER TABLE t ADD COLUMN c INT"]
    p = plan_ddl("ALTER TABLE t SHARD_ROW_ID_BITS = 4", 99, "s", MARIADB)  # unknown code, nothing left
    assert not p.execute and "nothing left" in p.reason
    p = plan_ddl("ALTER TABLE t EXCHANGE PARTITION p WITH TABLE t2", 999, "s", MARIADB)  # unknown: run it
    assert p.execute and p.sql == "ALTER TABLE t EXCHANGE PARTITION p WITH TABLE t2"


def test_error_classification() -> None:
    for code in (1007, 1008, 1050, 1051, 1054, 1060, 1061, 1068, 1091, 1176, 1507, 1517):
        assert classify_ddl_error(code) is ErrorClass.ALREADY_APPLIED
    for code in (1044, 1045, 1046, 1049, 1064, 1149, 1066, 1072, 1082, 1146, 1166, 1505, 3750):
        assert classify_ddl_error(code) is ErrorClass.FATAL
    for code in (1205, 1213, 2002, 2003, 2006, 2013):
        assert classify_ddl_error(code) is ErrorClass.TRANSIENT
        assert code in TRANSIENT_ERRORS  # a row statement failing so is replayed
    for code in (1049, 1062, 1146, 1054, 1105):
        assert code not in TRANSIENT_ERRORS  # a row statement failing so stops the daemon (ApplyError)
    assert classify_ddl_error(None) is ErrorClass.UNKNOWN


def test_transient_class_reads_the_errno_of_errno_carrying_codes_only() -> None:
    from sqlgen import transient_class

    assert transient_class(1290) == "read_only"
    assert transient_class(1114, "The table 't' is full") == "disk_full"
    assert transient_class(
        1005, 'Can\'t create table `d`.`t` (errno: 135 "No more room in record file")'
    ) == ("disk_full")
    assert transient_class(1005, 'Can\'t create table `d`.`t` (errno: 150 "Foreign key ...")') is None
    # a number in the text of a code that carries none means nothing
    assert transient_class(1146, "Table 'error 28' doesn't exist") is None
    assert transient_class(None) is None
