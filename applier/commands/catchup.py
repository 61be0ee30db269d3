"""``applier catchup``: run the job, print the summary, turn known failures into one clear line."""

from __future__ import annotations

import sys

from applier.ops.logs import configure, get_logger
from applier.ops.redact import redact_text
from applier.settings.schema import Config

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def run_catchup_command(cfg: Config) -> int:
    configure(cfg.log_format, cfg.log_level)
    log = get_logger(component="catchup")
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        print(
            f"applier: catchup needs pyspark and pyarrow ({exc.name} is missing): "
            "pip install 'ticdc-applier[spark]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from applier.apply.ddl import DDLFailed, DDLUnsettled
    from applier.catchup.job import CatchupError, run_catchup
    from applier.codec.errors import MalformedRecordError
    from applier.downstream.errors import DownstreamConnectError
    from applier.downstream.lock import LockLost
    from applier.downstream.url import DownstreamConfigError
    from applier.kafka.reader import KafkaReadError
    from applier.large_messages.errors import LargeMessageError
    from applier.large_messages.storage import ObjectStoreConfigError
    from checkpoint import FencedOut

    try:
        summary = run_catchup(cfg)
    except (DownstreamConfigError, ObjectStoreConfigError) as exc:
        print(f"applier: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except (
        CatchupError,
        DDLFailed,
        DDLUnsettled,
        DownstreamConnectError,
        KafkaReadError,
        LockLost,
        FencedOut,
        MalformedRecordError,
        LargeMessageError,
    ) as exc:
        log.error("catch-up failed: " + redact_text(str(exc)), error_type=type(exc).__name__)
        return EXIT_FAILURE
    for line in summary.lines():
        print(line)
    return EXIT_OK
