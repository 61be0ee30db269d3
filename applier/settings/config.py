"""The effective configuration of one command: one typed attribute per setting.

An attribute reads :attr:`Config.values` (what :func:`applier.settings.schema.resolve` merged from
flags, variables, the file and defaults, each already parsed to its type by the settings table),
so ``cfg.apply_workers`` is an ``int`` where the command has that setting, and an AttributeError
where it does not (``until`` of ``applier run``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from applier.codec.decoder import DecoderOptions
from sqlgen.route import Router

if TYPE_CHECKING:
    from applier.kafka.topics import TopicSet
    from applier.stream.table_filter import TableFilter

T = TypeVar("T")


class _Value(Generic[T]):
    """A setting as an attribute of :class:`Config`, typed as its parser returns it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _Value[T]: ...
    @overload
    def __get__(self, obj: Config, owner: type) -> T: ...
    def __get__(self, obj: Config | None, owner: type) -> T | _Value[T]:
        if obj is None:
            return self
        try:
            return obj.values[self.name]
        except KeyError:
            raise AttributeError(self.name) from None


@dataclass
class Config:
    """The effective configuration of one command; ``sources`` says where each value came from."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    # One attribute per row of applier.settings.table.SETTINGS (tests/unit/test_settings_schema.py
    # checks that they match).
    kafka_bootstrap = _Value[str]()
    topic = _Value[str]()
    group_id = _Value[str]()
    downstream = _Value[str]()
    downstream_password_file = _Value["str | None"]()
    downstream_ssl_mode = _Value["str | None"]()
    downstream_ssl_ca = _Value["str | None"]()
    downstream_ssl_cert = _Value["str | None"]()
    downstream_ssl_key = _Value["str | None"]()
    downstream_ssl_verify_identity = _Value[bool]()
    checkpoint_schema = _Value[str]()
    legacy_base64_strings = _Value[bool]()
    compression = _Value[str]()
    kafka_config = _Value["dict[str, str]"]()
    claim_check_storage_uri = _Value["str | None"]()
    upstream = _Value["str | None"]()
    upstream_password_file = _Value["str | None"]()
    large_message_workers = _Value[int]()
    filter = _Value["tuple[str, ...]"]()
    route = _Value["list[str]"]()
    start = _Value[str]()
    time_zone = _Value[str]()
    max_txn_rows = _Value[int]()
    apply_workers = _Value[int]()
    early_rows = _Value[int]()
    ddl_blocking = _Value[str]()
    consistency = _Value[str]()
    row_settle_seconds = _Value[float]()
    max_cached_bytes = _Value[int]()
    spill_dir = _Value["str | None"]()
    standby_poll_seconds = _Value[int]()
    exit_when_caught_up = _Value[bool]()
    http_listen = _Value[str]()
    stall_seconds = _Value[int]()
    retry_report_seconds = _Value[int]()
    log_format = _Value[str]()
    log_level = _Value[str]()
    from_ts = _Value["int | None"]()
    until = _Value["int | None"]()
    spark_master = _Value[str]()
    spark_conf = _Value["dict[str, str]"]()
    catchup_class_archive = _Value["str | None"]()
    catchup_parallelism = _Value["int | None"]()
    catchup_split_records = _Value[int]()
    catchup_collapse_in_reader = _Value[bool]()
    catchup_retry_seconds = _Value[int]()
    catchup_time_lookup_margin_seconds = _Value["int | None"]()

    def decoder_options(self) -> DecoderOptions:
        """How to decode this changefeed's records: the one place the daemon, the catch-up and
        ``applier decode`` build their options. The checkpoint schema is reserved: no DDL event
        may touch it (:mod:`sqlgen.ddl_guard`)."""
        ckpt = self.values.get("checkpoint_schema")
        compression = self.values.get("compression") or "none"
        return DecoderOptions(
            legacy_base64_strings=bool(self.values.get("legacy_base64_strings")),
            compression=None if compression == "none" else compression,
            reserved_schemas=frozenset({ckpt}) if ckpt else frozenset(),
        )

    def topics(self) -> TopicSet:
        """The topics of this changefeed (``topic``): one, several, or ``/regex/`` patterns."""
        from applier.kafka.topics import TopicSet

        return TopicSet.parse(self.values["topic"])

    def table_filter(self) -> TableFilter:
        """The tables this changefeed replicates (``filter``): the one place the daemon and the
        catch-up build it."""
        from applier.stream.table_filter import TableFilter

        return TableFilter(self.values.get("filter") or ())

    def router(self) -> Router:
        """The route rules (``sqlgen.route``) of the daemon and the catch-up; the checkpoint schema
        may not be a target."""
        ckpt = self.values.get("checkpoint_schema")
        return Router.from_rules(self.values.get("route") or (), reserved_schemas=[ckpt] if ckpt else ())

    def masked(self) -> dict[str, Any]:
        """The values with every secret hidden: what may be printed or logged."""
        from applier.ops.redact import redact_url
        from applier.settings.table import SETTINGS_BY_NAME

        out: dict[str, Any] = {}
        for name, value in self.values.items():
            setting = SETTINGS_BY_NAME.get(name)
            if setting is not None and setting.secret and value:
                if name in ("downstream", "upstream"):
                    value = redact_url(value)
                elif name == "claim_check_storage_uri":
                    from applier.large_messages.storage import redacted_uri

                    value = redacted_uri(value)
                elif isinstance(value, dict):
                    value = {k: ("***" if _looks_secret(k) else v) for k, v in value.items()}
                else:
                    value = "***"
            out[name] = value
        return out


def _looks_secret(key: str) -> bool:
    low = key.lower()
    return any(word in low for word in ("password", "secret", "key", "token", "sasl.oauthbearer"))
