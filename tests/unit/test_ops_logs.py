"""The daemon's loggers follow the configuration, whenever they were made."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog

from applier.ops.logs import configure, get_logger


@pytest.fixture
def restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def test_a_logger_made_before_configure_writes_the_configured_format(restore_logging: None) -> None:
    early = get_logger(component="lock")  # as a module-level logger is, at import
    out = io.StringIO()
    configure("json", "info", stream=out)
    early.warning("single-active lock session failed; lock re-taken", lock="x")
    get_logger(component="apply").bind(rows=3).info("window applied")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["event"], x["component"], x["level"]) for x in lines] == [
        ("single-active lock session failed; lock re-taken", "lock", "warning"),
        ("window applied", "apply", "info"),
    ]
    assert lines[0]["lock"] == "x" and lines[1]["rows"] == 3


def test_log_fields_named_like_secrets_are_masked_and_key_counts_only_at_the_end_of_a_part(
    restore_logging: None,
) -> None:
    out = io.StringIO()
    configure("json", "info", stream=out)
    get_logger().info(
        "x",
        password="p1",
        sasl_password="p2",
        access_key="p3",
        session_token="p4",
        keyless_rows=5,
        url="mysql://u:p5@db:3306/",
    )
    line = json.loads(out.getvalue())
    assert [line[k] for k in ("password", "sasl_password", "access_key", "session_token")] == ["***"] * 4
    assert line["keyless_rows"] == 5 and line["url"] == "mysql://u:***@db:3306/"
