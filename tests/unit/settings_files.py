"""Settings as the configuration tests give them: the required flags, and a configuration file."""

from __future__ import annotations

from pathlib import Path

BASE = {"kafka_bootstrap": "k:9092", "topic": "t", "group_id": "g", "downstream": "mysql://app@db:3306/"}
"""The flags every run needs (no password)."""

BASE_WITH_SECRET = {**BASE, "downstream": "mysql://u:s3cret@db:3306/"}
"""The same with a password in the downstream URL."""


def toml_file(tmp_path: Path, text: str) -> str:
    """``text`` written as the configuration file ``applier.toml`` in ``tmp_path``; its path."""
    path = tmp_path / "applier.toml"
    path.write_text(text)
    return str(path)
