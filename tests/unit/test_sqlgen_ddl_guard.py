"""sqlgen.ddl_guard: TiCDC's DDL shapes pass with their targets; anything else is refused.

The accepted shapes are the statements of TiCDC's own DDL integration tests (sequences of DDL,
multi-table renames, partition tables, re-entrant DDL) as the producers print them: as written,
re-printed by TiDB's parser (upper case, backticks, ``/*T![...]*/``) and as rebuilt for
DROP TABLE, RENAME TABLE and EXCHANGE PARTITION (docs/open-protocol.md §8.1).
"""

from __future__ import annotations

import pytest

from sqlgen.ddl_guard import DDLTargets, HostileDDL, check_ddl

CKPT = "ticdc_applier"

# (type, key schema, key table, query, schemas, tables)
ACCEPTED: list[tuple[int, str, str, str, set[str], set[tuple[str, str]]]] = [
    (1, "partition_table", "", "create database `partition_table`", {"partition_table"}, set()),
    (1, "d", "", "CREATE DATABASE IF NOT EXISTS `d` CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin",
     {"d"}, set()),
    (2, "d", "", "DROP DATABASE IF EXISTS `d`", {"d"}, set()),
    (26, "d", "", "ALTER DATABASE `d` CHARACTER SET = utf8mb4", {"d"}, set()),
    (26, "d", "", "ALTER DATABASE CHARACTER SET = utf8mb4", {"d"}, set()),
    (3, "d", "t", "create table t (a int primary key)", {"d"}, {("d", "t")}),
    (3, "d", "t", "CREATE TABLE `d`.`t` (`a` INT PRIMARY KEY /*T![clustered_index] CLUSTERED */)",
     {"d"}, {("d", "t")}),
    (3, "partition_table", "t",
     "create table t (a int, b varchar(255), primary key (a), unique key (b) global) "
     "partition by hash(a) partitions 5",
     {"partition_table"}, {("partition_table", "t")}),
    (3, "d", "t1b", "create table t1b like t1", {"d"}, {("d", "t1b"), ("d", "t1")}),
    (3, "d", "t1b", "CREATE TABLE `t1b` LIKE `other`.`t1`", {"d", "other"}, {("d", "t1b"), ("other", "t1")}),
    (3, "d", "t", "CREATE TABLE t (LIKE s.u)", {"d", "s"}, {("d", "t"), ("s", "u")}),
    (3, "d", "child", "CREATE TABLE child (id INT, pid INT, "
     "FOREIGN KEY (pid) REFERENCES `p`.`parent`(id) ON DELETE CASCADE)",
     {"d", "p"}, {("d", "child"), ("p", "parent")}),
    (3, "d", "a`b", "CREATE TABLE `a``b` (x INT) COMMENT 'it''s; DROP TABLE y'", {"d"}, {("d", "a`b")}),
    (3, "d", "t", "/* leading */ CREATE TABLE t (a INT) -- trailing\n;", {"d"}, {("d", "t")}),
    (3, "d", "t", "CREATE TABLE t (a INT) /*!50100 PARTITION BY HASH (a) */;;", {"d"}, {("d", "t")}),
    (60, "d", "t", "CREATE TABLE `t` (`a` INT);", {"d"}, {("d", "t")}),
    (4, "d", "t", "DROP TABLE `d`.`t`", {"d"}, {("d", "t")}),
    (4, "d", "t", "drop table if exists t", {"d"}, {("d", "t")}),
    (5, "d", "t", "alter table t add column c int after a", {"d"}, {("d", "t")}),
    (6, "d", "t", "ALTER TABLE `d`.`t` DROP COLUMN `c`", {"d"}, {("d", "t")}),
    (7, "d", "t", "CREATE UNIQUE INDEX `i` ON `t` (`b`)", {"d"}, {("d", "t")}),
    (7, "d", "t", "alter table t add index i (b), add unique key u (c) global", {"d"}, {("d", "t")}),
    (7, "d", "t", "CREATE SPATIAL INDEX g ON t (p)", {"d"}, {("d", "t")}),
    (8, "d", "t", "DROP INDEX i ON t", {"d"}, {("d", "t")}),
    (8, "d", "t", "alter table t drop index i", {"d"}, {("d", "t")}),
    (9, "d", "t", "ALTER TABLE t ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES p (id)",
     {"d"}, {("d", "t"), ("d", "p")}),
    (11, "d", "t", "truncate table t", {"d"}, {("d", "t")}),
    (11, "d", "t", "TRUNCATE `d`.`t`", {"d"}, {("d", "t")}),
    (12, "d", "t", "ALTER TABLE t MODIFY COLUMN a BIGINT NOT NULL DEFAULT 0 COMMENT 'x'",
     {"d"}, {("d", "t")}),
    (14, "d", "b", "rename table a to b", {"d"}, {("d", "a"), ("d", "b")}),
    (14, "d2", "b", "RENAME TABLE `d`.`a` TO `d2`.`b`;", {"d", "d2"}, {("d", "a"), ("d2", "b")}),
    (14, "d", "b", "ALTER TABLE a RENAME TO b", {"d"}, {("d", "a"), ("d", "b")}),
    (14, "d", "b", "alter table a rename b", {"d"}, {("d", "a"), ("d", "b")}),
    (47, "d", "t2", "RENAME TABLE t1 TO t2, x.t3 TO t4",
     {"d", "x"}, {("d", "t1"), ("d", "t2"), ("x", "t3"), ("d", "t4")}),
    (17, "d", "t", "ALTER TABLE t COMMENT = 'rename to mysql.user'", {"d"}, {("d", "t")}),
    (18, "d", "t", "ALTER TABLE t RENAME INDEX a TO b", {"d"}, {("d", "t")}),
    (19, "d", "t1", "alter table t1 add partition (partition p3 values less than (30))",
     {"d"}, {("d", "t1")}),
    (20, "d", "t1", "alter table t1 drop partition p1", {"d"}, {("d", "t1")}),
    (21, "d", "v", "CREATE ALGORITHM = UNDEFINED DEFINER = `root`@`%` SQL SECURITY DEFINER "
     "VIEW `v` AS SELECT `a` FROM `d`.`t`",
     {"d"}, {("d", "v")}),
    (21, "d", "v", "create or replace view v (x) as select a from t where a > 1", {"d"}, {("d", "v")}),
    (22, "d", "t", "ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4", {"d"}, {("d", "t")}),
    (23, "d", "t", "alter table t truncate partition p3", {"d"}, {("d", "t")}),
    (24, "d", "v", "DROP VIEW `d`.`v`", {"d"}, {("d", "v")}),
    (32, "d", "t", "ALTER TABLE t ADD PRIMARY KEY (a) NONCLUSTERED", {"d"}, {("d", "t")}),
    (33, "d", "t", "ALTER TABLE t DROP PRIMARY KEY", {"d"}, {("d", "t")}),
    (34, "d", "s", "CREATE SEQUENCE s START WITH 1", {"d"}, {("d", "s")}),
    (36, "d", "s", "DROP SEQUENCE `d`.`s`", {"d"}, {("d", "s")}),
    # EXCHANGE PARTITION keyed to either side (classic: partitioned table; new: normal table)
    (42, "partition_table", "t1b",
     "ALTER TABLE `partition_table`.`t1b` EXCHANGE PARTITION `p3` WITH TABLE `partition_table2`.`t2`",
     {"partition_table", "partition_table2"}, {("partition_table", "t1b"), ("partition_table2", "t2")}),
    (42, "partition_table2", "t2",
     "ALTER TABLE `partition_table`.`t1b` EXCHANGE PARTITION `p3` WITH TABLE `partition_table2`.`t2`",
     {"partition_table", "partition_table2"}, {("partition_table", "t1b"), ("partition_table2", "t2")}),
    (42, "d", "t1", "ALTER TABLE t1 EXCHANGE PARTITION p3 WITH TABLE t2 WITHOUT VALIDATION",
     {"d"}, {("d", "t1"), ("d", "t2")}),
    (61, "d", "t", "ALTER TABLE t ADD COLUMN b INT, DROP COLUMN c, ADD INDEX i (b)", {"d"}, {("d", "t")}),
    (64, "d", "t1", "ALTER TABLE t1 REORGANIZE PARTITION p0,p2 INTO (PARTITION p0 VALUES LESS THAN (5), "
     "PARTITION p1 VALUES LESS THAN (10), PARTITION p2 VALUES LESS THAN (21))",
     {"d"}, {("d", "t1")}),
    (71, "d", "t", "alter table t partition by hash (a) partitions 5 update indexes (b global)",
     {"d"}, {("d", "t")}),
    (72, "d", "t", "alter table t remove partitioning", {"d"}, {("d", "t")}),
    (65, "d", "t", "ALTER TABLE t TTL = `a` + INTERVAL 1 DAY", {"d"}, {("d", "t")}),
    # skipped TiDB-only types: never run, the key is not compared
    (30, "d", "t", "ALTER DATABASE d SET TIFLASH REPLICA 1", {"d"}, set()),
    (51, "", "", "CREATE PLACEMENT POLICY p1 PRIMARY_REGION='r1' REGIONS='r1'", set(), set()),
    (16, "d", "t", "ALTER TABLE t SHARD_ROW_ID_BITS = 4", {"d"}, {("d", "t")}),
    # an unknown type code: the key's own table
    (999, "d", "t", "ALTER TABLE t ADD COLUMN z INT", {"d"}, {("d", "t")}),
    (999, "d", "t", "RENAME TABLE t TO t_new", {"d"}, {("d", "t"), ("d", "t_new")}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("ddl_type", "schema", "table", "query", "schemas", "tables"),
    ACCEPTED,
    ids=[f"{a[0]}:{a[3][:50]}" for a in ACCEPTED],
)
def test_ticdc_ddl_shapes_pass_with_every_object_they_touch(ddl_type, schema, table, query, schemas, tables):
    assert check_ddl(query, ddl_type, schema, table, reserved_schemas={CKPT}) == DDLTargets(
        frozenset(schemas), frozenset(tables)
    )


# (type, key schema, key table, query, a word of the reason)
REFUSED: list[tuple[int, str, str, str, str]] = [
    (3, "d", "t", "GRANT ALL ON *.* TO x", "GRANT"),
    (3, "d", "t", "CREATE USER x IDENTIFIED BY 'y'", "CREATE USER"),
    (3, "d", "t", "SET GLOBAL read_only=1", "SET"),
    (3, "d", "t", "CREATE TABLE t (a int); DROP TABLE x", "more than one statement"),
    (3, "d", "t", "CREATE TABLE t (a int) /*!; DROP TABLE x */", "more than one statement"),
    (3, "d", "t", "CREATE TABLE t (a int) /*T![x] ; DROP TABLE x */", "more than one statement"),
    # a string that ends at the backslash under NO_BACKSLASH_ESCAPES hides nothing
    (3, "d", "t", "CREATE TABLE t (a int) COMMENT 'x\\' ; DROP TABLE y; -- '", "more than one statement"),
    (4, "db", "t", "DROP TABLE other.t", "keyed to"),
    (4, "db", "t", f"DROP TABLE {CKPT}.changefeed", "reserved schema"),
    (4, "db", "t", "DROP TABLE t, u", "keyed to"),
    (5, "db", "t", f"ALTER TABLE `{CKPT}`.`checkpoint` ADD COLUMN x INT", "reserved schema"),
    (5, CKPT, "checkpoint", "ALTER TABLE checkpoint ADD COLUMN x INT", "reserved schema"),
    (14, "db", "t", f"RENAME TABLE t TO {CKPT}.x", "reserved schema"),
    (14, "db", "x", "RENAME TABLE t TO x, u TO v", "several tables"),
    (14, "db", "zz", "RENAME TABLE t TO x", "none of which"),
    (3, "db", "t", "CREATE TABLE t LIKE mysql.user", "reserved schema"),
    (3, "db", "t", "CREATE TABLE t LIKE `MySQL`.`user`", "reserved schema"),
    (11, "db", "t", "TRUNCATE mysql.user", "reserved schema"),
    (2, CKPT, "", f"DROP DATABASE {CKPT}", "reserved schema"),
    (2, "db", "", "DROP DATABASE other", "keyed to schema"),
    (1, "sys", "", "CREATE DATABASE sys", "reserved schema"),
    (21, "db", "v", "CREATE VIEW v AS SELECT user, authentication_string FROM mysql.user", "reserved schema"),
    (3, "db", "t", "CREATE TABLE t AS SELECT * FROM x", "SELECT"),
    (3, "db", "t", "CREATE TABLE t (a INT) SELECT 1", "SELECT"),
    (3, "db", "t", "CREATE TEMPORARY TABLE t (a INT)", "TEMPORARY"),
    (3, "db", "t", "CREATE OR REPLACE TABLE t (a INT)", "OR REPLACE"),
    (3, "db", "t", "CREATE TABLE t (a INT) DATA DIRECTORY = '/var/lib/mysql/mysql'", "DIRECTORY"),
    (3, "db", "t", "CREATE TABLE t (a INT) ENGINE=CONNECT TABLE_TYPE=CSV FILE_NAME='/etc/passwd'", "ENGINE"),
    (3, "db", "t", "CREATE TABLE t (a INT) ENGINE=InnoDB CONNECTION='mysql://u@h/d/t'", "CONNECTION"),
    (
        3,
        "db",
        "t",
        "CREATE TABLE t (a INT) COMMENT 'x' ENGINE = MERGE UNION = (mysql.user)",
        "reserved schema",
    ),
    (5, "db", "t", "ALTER TABLE t DISCARD TABLESPACE", "TABLESPACE"),
    (3, "db", "t", "CREATE TABLE other (a INT)", "keyed to"),
    (3, "db", "t", "DROP TABLE t", "DDL type 3"),
    (4, "db", "t", "ALTER TABLE t ADD COLUMN b INT", "DDL type 4"),
    (5, "db", "t", "ALTER TABLE t RENAME TO u", "no rename"),
    (5, "db", "t", "ALTER TABLE t EXCHANGE PARTITION p WITH TABLE u", "no EXCHANGE"),
    (42, "db", "zz", "ALTER TABLE t EXCHANGE PARTITION p WITH TABLE u", "neither"),
    (42, "db", "t", "ALTER TABLE t EXCHANGE PARTITION p WITH TABLE mysql.user", "reserved schema"),
    (7, "db", "t", "CREATE INDEX i ON u (a)", "keyed to"),
    (21, "db", "v", "CREATE DEFINER = root TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET @x = 1", "TRIGGER"),
    (3, "db", "t", "CREATE FUNCTION f() RETURNS INT RETURN 1", "FUNCTION"),
    (3, "db", "t", "CREATE SPATIAL REFERENCE SYSTEM 4120 NAME 'x'", "CREATE SPATIAL"),
    (3, "db", "t", "CREATE PROCEDURE p() SELECT 1", "PROCEDURE"),
    (3, "db", "t", "CREATE EVENT e ON SCHEDULE EVERY 1 DAY DO DELETE FROM t", "EVENT"),
    (4, "db", "t", "DROP USER x", "DROP USER"),
    (3, "db", "t", "ALTER USER root IDENTIFIED BY 'x'", "ALTER USER"),
    (3, "db", "t", "INSERT INTO t VALUES (1)", "INSERT"),
    (4, "db", "t", "DELETE FROM t", "DELETE"),
    (3, "db", "t", "UPDATE t SET a = 1", "UPDATE"),
    (3, "db", "t", "CALL p()", "CALL"),
    (3, "db", "t", "LOAD DATA INFILE '/etc/passwd' INTO TABLE t", "LOAD"),
    (3, "db", "t", "SELECT * FROM t INTO OUTFILE '/tmp/x'", "OUTFILE"),
    (3, "db", "t", "FLUSH PRIVILEGES", "FLUSH"),
    (3, "db", "t", "KILL 1", "KILL"),
    (3, "db", "t", "SHUTDOWN", "SHUTDOWN"),
    (3, "db", "t", "INSTALL PLUGIN x SONAME 'x.so'", "INSTALL"),
    (3, "db", "t", "REVOKE ALL ON *.* FROM x", "REVOKE"),
    (3, "db", "t", "", "no statement"),
    (3, "db", "t", "  -- nothing\n", "no statement"),
    # skipped types still refuse what no DDL of theirs is
    (30, "db", "t", "GRANT ALL ON *.* TO x", "GRANT"),
    (16, "db", "t", "DROP DATABASE mysql", "DDL type 16"),
    # unknown type codes: only DDL of the key's objects
    (999, "db", "t", "LOCK TABLES t WRITE", "DDL type 999"),
    (999, "db", "t", "RENAME TABLE t TO other.t", "unknown"),
]


@pytest.mark.parametrize(
    ("ddl_type", "schema", "table", "query", "reason"),
    REFUSED,
    ids=[f"{r[0]}:{r[3][:50]}" for r in REFUSED],
)
def test_text_that_is_not_the_ddl_of_its_event_is_refused_with_the_reason(
    ddl_type, schema, table, query, reason
):
    with pytest.raises(HostileDDL, match=r"(?i)" + reason.replace("(", r"\(").replace("*", r"\*")):
        check_ddl(query, ddl_type, schema, table, reserved_schemas={CKPT})


def test_keywords_compare_in_any_case_names_exactly() -> None:
    assert check_ddl("dRoP tAbLe `D`.`T`", 4, "D", "T").tables == {("D", "T")}
    with pytest.raises(HostileDDL, match="keyed to"):
        check_ddl("DROP TABLE `d`.`T`", 4, "d", "t")


def test_the_checkpoint_schema_is_reserved_only_when_passed() -> None:
    assert check_ddl("DROP TABLE c.t", 4, "c", "t").schemas == {"c"}
    with pytest.raises(HostileDDL, match="reserved schema 'c'"):
        check_ddl("DROP TABLE c.t", 4, "c", "t", reserved_schemas=["c"])


def test_a_schema_ddl_without_key_schema_names_its_own() -> None:
    assert check_ddl("CREATE DATABASE x", 1, "", "").schemas == {"x"}
    with pytest.raises(HostileDDL, match="reserved"):
        check_ddl("CREATE DATABASE information_schema", 1, "", "")
