"""``applier catchup``: run the job, print the summary, turn known failures into one clear line."""

from __future__ import annotations

import sys
import tempfile

from applier.commands.run import report_configuration_error
from applier.errors import EXIT_OK, EXIT_USAGE, ConfigurationError, FatalError
from applier.ops.logs import configure, get_logger
from applier.ops.redact import redact_text
from applier.settings.schema import Config


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
    from applier.catchup.job import run_catchup

    try:
        _check_temp_dir()
        summary = run_catchup(cfg)
    except ConfigurationError as exc:
        return report_configuration_error(exc)
    except FatalError as exc:
        log.error("catch-up failed: " + redact_text(str(exc)), error_type=type(exc).__name__)
        return exc.exit_code
    for line in summary.lines():
        print(line)
    return EXIT_OK


def _check_temp_dir() -> None:
    """Spark's driver and its Python workers write to the temporary directory from their first
    step (the gateway's connection file, shuffle and broadcast files): without one the job fails
    deep inside PySpark. Say so first, naming what to mount."""
    try:
        tempfile.gettempdir()
    except FileNotFoundError:
        raise ConfigurationError(
            "the catch-up needs a writable temporary directory (TMPDIR, /tmp) for Spark; in a read-only "
            "container mount a tmpfs on /tmp (docker/README.md)"
        ) from None
