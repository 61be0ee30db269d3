"""Keep secrets out of logs, status output and exception messages: one place for masking."""

from __future__ import annotations

import re

SECRET_WORDS = ("secret", "token", "password", "passwd", "pwd", "credential", "signature", "private", "key")
"""Words that make a setting, a URI option or a log field secret (the words TiCDC masks): its value
is shown as ``***``. Matching is loose on purpose, so a misspelt option is masked too; over-masking
is harmless."""

_NAME_PARTS = re.compile(r"[^a-z0-9]+")


def looks_secret(name: str) -> bool:
    """Whether a setting, URI option or log field called ``name`` holds a secret: a part of it
    (split at ``.``, ``-``, ``_`` and the like) contains a secret word. ``key`` counts only at the
    end of a part (``access-key``, ``accesskey``, ``ssl.key.password``), not in ``keyless``."""
    for part in _NAME_PARTS.split(name.lower()):
        for word in SECRET_WORDS:
            if part.endswith(word) if word == "key" else word in part:
                return True
    return False


_URL_PASSWORD = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]*)@", re.IGNORECASE
)


def redact_url(text: str) -> str:
    """Mask the password of one URL, even one that does not parse (for messages about bad URLs).

    Conservative on purpose: everything from the first ':' after ``scheme://`` up to the LAST '@'
    is masked, because an unencoded password may contain '@', '/', '?' or '#' and then no URL
    parser agrees where it ends. It can over-mask an odd URL; it never under-masks.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    at = rest.rfind("@")
    colon = rest.find(":")
    if at < 0 or colon < 0 or colon > at:
        return text
    return f"{scheme}://{rest[:colon]}:***{rest[at:]}"


def redact_text(text: str) -> str:
    """Mask every ``scheme://user:password@`` inside free text (log lines, exception messages)."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
