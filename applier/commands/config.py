"""``applier config check``: the effective settings as ``run`` would use them, secrets masked."""

from __future__ import annotations

import json

from applier.commands.run import report_configuration_error
from applier.errors import EXIT_OK, ConfigurationError
from applier.kafka.reader import check_consumer_config
from applier.settings.downstream import downstream_config, password_source
from applier.settings.schema import Config


def run_config_check(cfg: Config) -> int:
    try:  # the URL, TLS options, password file, routes and librdkafka settings, as `run` checks them
        downstream = downstream_config(cfg)
        router = cfg.router()
        check_consumer_config(cfg.group_id, cfg.kafka_config)
    except ConfigurationError as exc:
        return report_configuration_error(exc)
    doc = {
        "effective": cfg.masked(),
        "sources": cfg.sources,
        "downstream_effective": downstream.redacted(),
        "downstream_password": password_source(cfg, downstream),
        "filter_effective": cfg.table_filter().describe(),  # the rules in force, in order
        "topics": _topics(cfg),
        "routes": {
            "rules": router.describe(),
            "order": "first matching rule wins; a table no rule matches keeps its names",
        },
    }
    print(json.dumps(doc, indent=2, sort_keys=True))
    return EXIT_OK


def _topics(cfg: Config) -> dict[str, object]:
    """The topic set as the daemon reads it: names, patterns, and whether it is one plain topic."""
    topics = cfg.topics()
    return {
        "names": list(topics.names),
        "patterns": [f"/{p}/" for p in topics.patterns],
        "read_as": "one topic" if topics.single is not None else "several topics under one barrier",
    }
