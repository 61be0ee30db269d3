"""Keep secrets out of logs, status output and exception messages."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_URL_PASSWORD = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]*)@", re.IGNORECASE
)


def redact_url(url: str) -> str:
    """``mysql://u:pw@h:1/`` -> ``mysql://u:***@h:1/``; anything unparsable is returned with passwords masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def redact_text(text: str) -> str:
    """Mask every ``scheme://user:password@`` in free text."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
