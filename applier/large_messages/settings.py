"""Where large messages are read from, as configured: the one place ``run`` and ``catchup`` build it.

``claim_check_storage_uri``: the storage root of claim-check objects as this host sees it (a
``file://`` directory or an ``s3://`` bucket and prefix, see :mod:`.storage`). ``upstream``: the
upstream TiDB's ``mysql://`` URL for handle-key-only rows, its password in
``APPLIER_UPSTREAM_PASSWORD``, ``APPLIER_UPSTREAM_PASSWORD_FILE`` or ``upstream_password_file``
(never the downstream's); its session uses the applier's ``time_zone``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from applier.codec.decoder import DecoderOptions
from applier.downstream.url import (
    ENV_PASSWORD,
    ENV_PASSWORD_FILE,
    DownstreamConfig,
    DownstreamConfigError,
    parse_downstream_url,
    read_password_file,
)
from applier.large_messages.resolver import LargeMessageQueue, LargeMessageResolver

ENV_UPSTREAM_PASSWORD = "APPLIER_UPSTREAM_PASSWORD"
ENV_UPSTREAM_PASSWORD_FILE = "APPLIER_UPSTREAM_PASSWORD_FILE"


def upstream_config(
    url: str, *, password_file: str | None, time_zone: str, env: Mapping[str, str] | None = None
) -> DownstreamConfig:
    """The upstream session settings; errors say "upstream" and never show the password."""
    environ = os.environ if env is None else env
    own = {
        k: v
        for k, v in (
            (ENV_PASSWORD, environ.get(ENV_UPSTREAM_PASSWORD)),
            (ENV_PASSWORD_FILE, environ.get(ENV_UPSTREAM_PASSWORD_FILE)),
        )
        if v
    }
    try:
        cfg = parse_downstream_url(url, env=own)
        if password_file:
            cfg = cfg.with_options(password=read_password_file(password_file), password_file=password_file)
        return cfg.with_options(time_zone=time_zone)
    except DownstreamConfigError as exc:
        raise DownstreamConfigError(str(exc).replace("downstream", "upstream")) from None


@dataclass(frozen=True)
class LargeMessageSettings:
    """The configured sources (either may be None) and how many fetches run at once."""

    claim_check_storage_uri: str | None = None
    upstream: DownstreamConfig | None = None
    workers: int = 8
    max_waiting_bytes: int = 256 << 20

    @classmethod
    def from_config(cls, cfg: Any, *, env: Mapping[str, str] | None = None) -> LargeMessageSettings:
        values = getattr(cfg, "values", {})
        url = values.get("upstream")
        upstream = None
        if url:
            upstream = upstream_config(
                url,
                password_file=values.get("upstream_password_file"),
                time_zone=values.get("time_zone") or "+00:00",
                env=env,
            )
        cached = values.get("max_cached_bytes")
        return cls(
            claim_check_storage_uri=values.get("claim_check_storage_uri") or None,
            upstream=upstream,
            workers=int(values.get("large_message_workers") or 8),
            # Fetched rows waiting to be fed are cached rows too: half the row cache's bound more.
            max_waiting_bytes=min(256 << 20, max(16 << 20, int(cached) // 2)) if cached else 256 << 20,
        )

    @property
    def configured(self) -> bool:
        return self.claim_check_storage_uri is not None or self.upstream is not None

    def resolver(self, options: DecoderOptions) -> LargeMessageResolver:
        """A resolver over the configured sources (opening the store checks its URI)."""
        from applier.large_messages.storage import open_store
        from applier.large_messages.upstream import UpstreamReader

        store = open_store(self.claim_check_storage_uri) if self.claim_check_storage_uri else None
        upstream = UpstreamReader(self.upstream) if self.upstream is not None else None
        return LargeMessageResolver(options=options, store=store, upstream=upstream)

    def queue(self, options: DecoderOptions) -> LargeMessageQueue | None:
        """The daemon's and the catch-up's stage; None when nothing is configured (then a
        large-message event stops the process with what to configure)."""
        if not self.configured:
            return None
        return LargeMessageQueue(
            self.resolver(options), workers=self.workers, max_waiting_bytes=self.max_waiting_bytes
        )
