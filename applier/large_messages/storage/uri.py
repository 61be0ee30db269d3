"""Claim-check storage roots parsed without touching the storage: the URI forms of TiDB's
external storage, so the producer's setting can usually be copied (see the package docstring)."""

from __future__ import annotations

import os
from typing import Final
from urllib.parse import parse_qsl, unquote, urlsplit

from applier.downstream.url import Secret
from applier.large_messages.storage.errors import ObjectStoreConfigError
from applier.large_messages.storage.file_store import FileLocation
from applier.large_messages.storage.redaction import normal_key
from applier.large_messages.storage.s3_store import S3Location

_VIRTUAL_HOST_PROVIDERS: Final = frozenset({"aws", "alibaba", "netease", "tencent"})
_S3_OPTIONS: Final = frozenset(
    {
        "endpoint",
        "region",
        "force-path-style",
        "access-key",
        "secret-access-key",
        "session-token",
        "profile",
        "provider",
        "use-accelerate-endpoint",
    }
)
# TiDB options that only matter when writing objects: accepted so the producer's URI can be copied.
_S3_WRITE_ONLY: Final = frozenset({"storage-class", "sse", "sse-kms-key-id", "acl", "object-lock-enabled"})
_ROLE_HINT: Final = "configure the role in an AWS profile (role_arn, ...) and give profile= or AWS_PROFILE"
_S3_UNSUPPORTED: Final = {"role-arn": _ROLE_HINT, "external-id": _ROLE_HINT}
_TRUE: Final = frozenset({"1", "t", "true"})  # Go's strconv.ParseBool, as TiDB reads the booleans
_FALSE: Final = frozenset({"0", "f", "false"})


def _bool_option(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ObjectStoreConfigError(f"claim-check storage option {name} must be true or false")


def _parse_file(uri: str) -> FileLocation:
    if uri.startswith("/"):
        path = uri
    else:
        split = urlsplit(uri)
        if split.query or split.fragment:
            raise ObjectStoreConfigError("a file:// claim-check root takes no options ('?...' or '#...')")
        if split.netloc not in ("", "localhost"):
            raise ObjectStoreConfigError(
                "a file:// claim-check root names a host: write file:///absolute/path "
                "(three slashes; file://data/x would mean host 'data')"
            )
        path = unquote(split.path)
    if not path.startswith("/"):
        raise ObjectStoreConfigError(
            "a file claim-check root must be an absolute path, e.g. file:///data/claim-check"
        )
    if "\0" in path:
        raise ObjectStoreConfigError("a file claim-check root must not contain NUL")
    # file:////x and //x: POSIX leaves a leading '//' to the implementation; mean /x as TiDB does.
    return FileLocation(os.path.normpath("/" + path.lstrip("/")))


def _parse_s3(uri: str) -> S3Location:
    try:
        split = urlsplit(uri)
    except ValueError:
        raise ObjectStoreConfigError("the s3:// claim-check root does not parse as a URI") from None
    if split.fragment:
        raise ObjectStoreConfigError(
            "the s3:// claim-check root contains '#': percent-encode it as %23 in option values"
        )
    netloc = split.netloc
    if "@" in netloc:
        raise ObjectStoreConfigError(
            "credentials before the bucket name are not supported: give access-key= and "
            "secret-access-key= options, or use the AWS environment"
        )
    if not netloc or ":" in netloc or any(c.isspace() for c in netloc):
        raise ObjectStoreConfigError("the s3:// claim-check root needs a bucket name: s3://bucket[/prefix]")
    prefix = unquote(split.path).strip("/")
    if "\0" in prefix:
        raise ObjectStoreConfigError("the s3:// claim-check prefix must not contain NUL")

    # TiDB turns '+' into '%2B' before parsing (secret keys contain '+'); do the same.
    options: dict[str, str] = {}
    for raw_key, value in parse_qsl(split.query.replace("+", "%2B"), keep_blank_values=True):
        key = normal_key(raw_key)
        if key in options:
            raise ObjectStoreConfigError(f"claim-check storage option {key} is given twice")
        options[key] = value
    for key in options:
        if key in _S3_UNSUPPORTED:
            raise ObjectStoreConfigError(
                f"claim-check storage option {key} is not supported by the applier: {_S3_UNSUPPORTED[key]}"
            )
        if key not in _S3_OPTIONS and key not in _S3_WRITE_ONLY:
            shown = key[:40] if key.isprintable() else repr(key[:40])
            raise ObjectStoreConfigError(
                f"unknown claim-check storage option {shown!r}; accepted: {', '.join(sorted(_S3_OPTIONS))} "
                f"(and, ignored as they only concern writing: {', '.join(sorted(_S3_WRITE_ONLY))})"
            )

    def get(key: str) -> str | None:
        value = options.get(key, "").strip()
        return value or None

    endpoint = get("endpoint")
    if endpoint is not None:
        if "@" in endpoint:
            # Checked first and on the raw text: a password with '/' in it makes the URL parse
            # differently, and the endpoint is shown in messages.
            raise ObjectStoreConfigError("claim-check storage option endpoint must not contain credentials")
        try:
            e = urlsplit(endpoint)
            e.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            e = None
        if e is None or e.scheme not in ("http", "https") or not e.hostname or e.query or e.fragment:
            raise ObjectStoreConfigError(
                "claim-check storage option endpoint must be an http:// or https:// URL with a host "
                "(and a port, a number)"
            )
        endpoint = endpoint.rstrip("/")

    access_key, secret_key, token = get("access-key"), get("secret-access-key"), get("session-token")
    if (access_key is None) != (secret_key is None):
        raise ObjectStoreConfigError(
            "claim-check storage options access-key and secret-access-key must be given together"
        )
    if token is not None and access_key is None:
        raise ObjectStoreConfigError(
            "claim-check storage option session-token needs access-key and secret-access-key"
        )

    provider = (get("provider") or "").lower()
    accelerate_value = get("use-accelerate-endpoint")
    accelerate = accelerate_value is not None and _bool_option("use-accelerate-endpoint", accelerate_value)
    fps = get("force-path-style")
    if fps is not None:
        style = "path" if _bool_option("force-path-style", fps) else "virtual"
    elif provider in _VIRTUAL_HOST_PROVIDERS or accelerate or "amazonaws.com" in (endpoint or ""):
        style = "virtual"
    else:
        style = "path"
    if accelerate and style == "path":
        raise ObjectStoreConfigError(
            "claim-check storage options use-accelerate-endpoint and force-path-style=true exclude each other"
        )

    return S3Location(
        bucket=netloc,
        prefix=prefix,
        endpoint=endpoint,
        region=get("region"),
        addressing_style=style,
        access_key=Secret(access_key or ""),
        secret_key=Secret(secret_key or ""),
        session_token=Secret(token or ""),
        profile=get("profile"),
        accelerate=accelerate,
    )


def parse_uri(uri: str) -> FileLocation | S3Location:
    """Parse a claim-check storage root without touching the storage (see the module docstring)."""
    if not isinstance(uri, str) or not uri.strip():
        raise ObjectStoreConfigError("the claim-check storage URI is empty")
    uri = uri.strip()
    if uri.startswith("/"):
        return _parse_file(uri)
    scheme, sep, _ = uri.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ObjectStoreConfigError(
            "a claim-check storage root is file:///absolute/path, an absolute path or s3://bucket[/prefix]"
        )
    if scheme in ("file", "local"):
        return _parse_file(uri)
    if scheme == "s3":
        return _parse_s3(uri)
    shown = scheme[:20] if scheme.isalnum() else "?"
    raise ObjectStoreConfigError(
        f"claim-check storage scheme {shown!r} is not supported: use file:///absolute/path or s3://bucket[/prefix]"
    )
