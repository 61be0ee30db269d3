"""A claim-check storage URI with its secrets masked, for messages and logs."""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

from applier.ops.redact import redact_text, redact_url

# Query keys whose values are masked by redacted_uri: the secret options and anything that looks
# secret (the same words TiCDC masks), so a misspelt option is masked too. Over-masking is harmless.
_SECRET_WORDS: Final = (
    "secret",
    "token",
    "password",
    "passwd",
    "pwd",
    "key",
    "credential",
    "signature",
    "private",
)
_QUERY_PAIR: Final = re.compile(r"(?P<sep>[?&;])(?P<key>[^=&;#?]*)=(?P<value>[^&;]*)")
_USERINFO: Final = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*://)[^/?#@:]*(?::\*\*\*)?@", re.IGNORECASE)


def normal_key(key: str) -> str:
    return unquote(key).strip().lower().replace("_", "-")


def _looks_secret(key: str) -> bool:
    k = normal_key(key)
    return any(word in k for word in _SECRET_WORDS)


def redacted_uri(uri: str) -> str:
    """``uri`` with every secret replaced by ``***``: secret-looking query values and a URL password
    (also inside option values such as an endpoint). Works on text that does not parse, too."""

    def mask(m: re.Match[str]) -> str:
        if _looks_secret(m["key"]):
            return f"{m['sep']}{m['key']}=***"
        return m.group(0)

    text = redact_url(_QUERY_PAIR.sub(mask, uri))
    # In a storage URI the user part is an access key: mask it whole (s3://AK:SK@bucket, s3://AK@bucket).
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return redact_text(text)
