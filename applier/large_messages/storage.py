"""Read claim-check objects from the storage root the applier is configured with.

TiCDC's claim-check handling writes a message too large for Kafka to external storage, as
``<uuid>.json`` directly under the changefeed's ``claim-check-storage-uri``, and sends a small record
naming its location instead. The applier reads the object from *its own* root
(``claim_check_storage_uri``) by the location's base name only (``codec.events.claim_check_name``):
the location comes from the topic, and opening it as is would let anyone who can write to the topic make the
daemon read any local file or any bucket its credentials reach. It also lets the consumer mount the
storage under another path than the producer.

Roots (the URI forms of TiDB's external storage, so the producer's setting can usually be copied):

* ``file:///data/claim-check`` (``file:////data/...`` and a plain absolute path mean the same);
* ``s3://bucket[/prefix]`` with the options ``endpoint``, ``region``, ``force-path-style``,
  ``access-key``, ``secret-access-key``, ``session-token``, ``profile``, ``provider`` and
  ``use-accelerate-endpoint``. Option names are matched as TiDB does (any case, ``_`` or ``-``), and
  ``+`` in a value is a plus (secret keys contain it). The options TiDB only uses for writing
  (``storage-class``, ``sse``, ``sse-kms-key-id``, ``acl``, ``object-lock-enabled``) are accepted
  and ignored; anything else is refused by name, without its value.

S3 goes through boto3 (the optional ``s3`` extra), which keeps the standard AWS environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, instance roles, ...): only what the URI
gives explicitly is passed on. Without ``force-path-style`` the addressing is path-style, as TiDB
defaults to, except where TiDB switches to virtual hosts (an ``amazonaws.com`` endpoint, the
``aws``, ``alibaba``, ``netease`` and ``tencent`` providers, the accelerate endpoint).

Errors: :class:`ObjectMissing` (the object is not there), :class:`ObjectUnreadable` (anything else
that will not pass by itself, or a transient failure that outlasted the retry budget),
:class:`ObjectStoreConfigError` (a bad root). Transient failures (connections, timeouts, throttling,
HTTP 5xx, I/O errors of a network file system) are retried, by botocore's ``standard`` mode and
around it with backoff for :attr:`RetryPolicy.budget` seconds, because a claim-check read sits in the
middle of applying a window and giving up at the first hiccup would stop the daemon.

No message, ``repr`` or log line made here contains an access key, a secret key or a session
token: errors name the root through :meth:`ObjectStore.describe`, which holds none.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn
from urllib.parse import parse_qsl, unquote, urlsplit

import tenacity

from applier.downstream.url import Secret
from applier.large_messages.errors import (
    ObjectMissing,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectUnreadable,
)
from applier.ops.logs import get_logger
from applier.ops.redact import redact_text, redact_url

__all__ = [
    "FileLocation",
    "FileStore",
    "ObjectMissing",
    "ObjectStore",
    "ObjectStoreConfigError",
    "ObjectStoreError",
    "ObjectUnreadable",
    "RetryPolicy",
    "S3Location",
    "S3Store",
    "check_name",
    "open_store",
    "parse_uri",
    "redacted_uri",
]

_log = get_logger(component="claim-check")

INSTALL_HINT: Final = "pip install 'ticdc-applier[s3]'"


class _Transient(Exception):
    """One attempt failed in a way that may pass; ``reason`` is already safe to show."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- names ---------------------------------------------------------------------------------------


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain object name, else raise ValueError.

    A plain name has no directory part, so joined to the root it can only name an entry directly
    under it: no ``/`` or ``\\``, not ``.`` or ``..``, no NUL, not empty.
    """
    if not isinstance(name, str):
        raise ValueError(f"object name must be a string, not {type(name).__name__}")
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(f"not a plain object name: {name[:120]!r}")
    return name


# --- retry policy --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long transient failures are retried before a read gives up with :class:`ObjectUnreadable`.

    ``budget`` bounds the time in which new attempts start (tenacity's ``stop_before_delay``); an
    attempt that starts late can still run for its timeouts and botocore's own ``sdk_attempts``, so a
    read gives up within about ``budget`` plus one attempt. Waits grow exponentially from
    ``initial`` to ``maximum`` seconds with full jitter, so several readers do not retry in step.
    A zero budget means a single attempt (tests).
    """

    budget: float = 30.0
    initial: float = 0.5
    maximum: float = 5.0
    sdk_attempts: int = 3  # botocore "standard" mode: total attempts of one request
    connect_timeout: float = 5.0
    read_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.budget < 0 or self.initial <= 0 or self.maximum < self.initial or self.sdk_attempts < 1:
            raise ValueError(f"invalid retry policy {self}")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError(f"invalid retry policy {self}")


# --- the stores ----------------------------------------------------------------------------------


class ObjectStore(ABC):
    """Reads objects by plain name under one root. Safe to share between threads."""

    def __init__(self, *, retry: RetryPolicy | None = None) -> None:
        self.retry = retry or RetryPolicy()

    @abstractmethod
    def describe(self) -> str:
        """The root for messages and logs: a URI-like text without any secret."""

    @abstractmethod
    def _read_once(self, name: str) -> bytes:
        """One attempt: the bytes, or ObjectMissing / ObjectUnreadable, or _Transient."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"

    def read(self, name: str) -> bytes:
        """The whole content of object ``name`` (a plain name, see :func:`check_name`).

        Raises ValueError for a name that is not plain, :class:`ObjectMissing`, or
        :class:`ObjectUnreadable` (at once for permanent errors, after the retry budget for
        transient ones).
        """
        check_name(name)
        policy = self.retry
        where = self.describe()

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            # One warning per read; the further attempts at debug level (an outage would flood the log).
            log = _log.warning if state.attempt_number == 1 else _log.debug
            log(
                "object store read failed, retrying",
                object=name,
                store=where,
                reason=getattr(exc, "reason", str(exc)),
                attempt=state.attempt_number,
                wait=round(state.upcoming_sleep, 3),
            )

        retrying = tenacity.Retrying(
            stop=tenacity.stop_before_delay(policy.budget),
            wait=tenacity.wait_random_exponential(multiplier=policy.initial, max=policy.maximum),
            retry=tenacity.retry_if_exception_type(_Transient),
            before_sleep=before_sleep,
            reraise=True,
        )
        attempts = 0
        start = time.monotonic()
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    return self._read_once(name)
        except _Transient as exc:
            if attempts > 1:
                _log.error(
                    "object store read failed for the whole retry budget",
                    object=name,
                    store=where,
                    reason=exc.reason,
                    attempts=attempts,
                    seconds=round(time.monotonic() - start, 3),
                )
            raise ObjectUnreadable(name, where, exc.reason, retried=attempts > 1, attempts=attempts) from None
        raise AssertionError("unreachable")  # pragma: no cover - tenacity returns or raises


# Errors of a local or network file system that may pass: I/O errors, stale NFS handles, a FUSE
# mount whose daemon is restarting, a full file table.
_TRANSIENT_ERRNOS: Final = frozenset(
    getattr(errno, n)
    for n in (
        "EIO",
        "EAGAIN",
        "EBUSY",
        "EINTR",
        "ETIMEDOUT",
        "ESTALE",
        "ENOTCONN",
        "ECONNRESET",
        "ECONNABORTED",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "ENETDOWN",
        "ENETUNREACH",
        "ENFILE",
        "EMFILE",
        "ENOLCK",
        "ENOMEM",
    )
    if hasattr(errno, n)
)


@dataclass(frozen=True, slots=True)
class FileLocation:
    """A parsed ``file://`` root: an absolute, normalised directory path."""

    root: str


class FileStore(ObjectStore):
    """Objects are the regular files directly under ``root``.

    The name is never a path (see :func:`check_name`), a symbolic link in place of an object is
    refused (``O_NOFOLLOW``: whoever can write into the storage directory must not make the daemon
    read other files), and so is anything but a regular file (a FIFO would block the reader: it is
    opened non-blocking and checked before reading). ``root`` itself may be a symbolic link.
    """

    def __init__(self, root: str, *, retry: RetryPolicy | None = None) -> None:
        super().__init__(retry=retry)
        if not os.path.isabs(root) or "\0" in root:
            raise ObjectStoreConfigError("a file claim-check root must be an absolute path")
        self.root = os.path.normpath(root)

    def describe(self) -> str:
        return f"file://{self.root}"

    def _fail(self, name: str, exc: OSError) -> NoReturn:
        reason = f"{exc.strerror or type(exc).__name__} (errno {exc.errno})"
        if exc.errno in _TRANSIENT_ERRNOS:
            raise _Transient(reason)
        raise ObjectUnreadable(name, self.describe(), reason)

    def _read_once(self, name: str) -> bytes:
        path = os.path.join(self.root, name)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if not os.path.isdir(self.root):
                raise ObjectUnreadable(
                    name, self.describe(), "the root directory does not exist (storage not mounted?)"
                ) from None
            raise ObjectMissing(name, self.describe()) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ObjectUnreadable(
                    name, self.describe(), "it is a symbolic link, and links are never followed"
                ) from None
            self._fail(name, exc)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ObjectUnreadable(name, self.describe(), "not a regular file")
            os.set_blocking(fd, True)
            with open(fd, "rb", closefd=False) as f:
                data = f.read()
        except OSError as exc:
            self._fail(name, exc)
        finally:
            os.close(fd)
        if len(data) < st.st_size:
            raise _Transient(f"short read: {len(data)} of {st.st_size} bytes")
        return data


# --- S3 ------------------------------------------------------------------------------------------

_VIRTUAL_HOST_PROVIDERS: Final = frozenset({"aws", "alibaba", "netease", "tencent"})

# S3 error codes that say "try again later" whatever the HTTP status (throttling and timeouts).
_TRANSIENT_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "ServiceUnavailable",
    }
)


@dataclass(frozen=True, slots=True)
class S3Location:
    """A parsed ``s3://`` root. Secrets are :class:`~applier.downstream.url.Secret` (``repr`` is ``***``).

    ``None`` means "not given": boto3 then takes the value from the AWS environment as usual.
    """

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    addressing_style: str = "path"  # "path" or "virtual"
    access_key: Secret = field(default_factory=Secret)
    secret_key: Secret = field(default_factory=Secret)
    session_token: Secret = field(default_factory=Secret)
    profile: str | None = None
    accelerate: bool = False

    def describe(self) -> str:
        """``s3://bucket/prefix``, plus the endpoint when one was given; never a secret."""
        root = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        if self.endpoint:
            root += f" at {redact_url(self.endpoint)}"
        return root


class S3Store(ObjectStore):
    """Objects are ``prefix/name`` in ``bucket``, read with GetObject through one boto3 client.

    The client is made once, here: boto3 clients may be used from several threads, sessions may not.
    """

    def __init__(self, location: S3Location, *, retry: RetryPolicy | None = None) -> None:
        super().__init__(retry=retry)
        self.location = location
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ObjectStoreConfigError(f"s3:// claim-check storage needs boto3: {INSTALL_HINT}") from None
        from botocore.exceptions import BotoCoreError

        policy = self.retry
        s3_config: dict[str, Any] = {"addressing_style": location.addressing_style}
        if location.accelerate:
            s3_config["use_accelerate_endpoint"] = True
        config = Config(
            # total_max_attempts counts the first try too (botocore's max_attempts counts retries only).
            retries={"mode": "standard", "total_max_attempts": policy.sdk_attempts},
            connect_timeout=policy.connect_timeout,
            read_timeout=policy.read_timeout,
            s3=s3_config,
            user_agent_extra="ticdc-applier",
        )
        kwargs: dict[str, Any] = {"config": config}
        if location.endpoint:
            kwargs["endpoint_url"] = location.endpoint
        if location.region:
            kwargs["region_name"] = location.region
        if location.access_key:
            kwargs["aws_access_key_id"] = location.access_key.reveal()
            kwargs["aws_secret_access_key"] = location.secret_key.reveal()
            if location.session_token:
                kwargs["aws_session_token"] = location.session_token.reveal()
        try:
            session = boto3.session.Session(profile_name=location.profile)
            self._client = session.client("s3", **kwargs)
        except (BotoCoreError, ValueError) as exc:
            raise ObjectStoreConfigError(
                f"cannot set up the S3 client for {self.describe()}: {self._scrub(str(exc))}"
            ) from None

    @property
    def bucket(self) -> str:
        return self.location.bucket

    @property
    def prefix(self) -> str:
        return self.location.prefix

    def describe(self) -> str:
        return self.location.describe()

    def key(self, name: str) -> str:
        """The object key of ``name`` (a plain name): ``prefix/name``, as TiDB's storage writes it."""
        check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    def _scrub(self, text: str) -> str:
        """Mask URL passwords and, as a last guard, any secret of the location in free text."""
        text = redact_text(text)
        loc = self.location
        for secret in (loc.access_key, loc.secret_key, loc.session_token):
            value = secret.reveal()
            if len(value) >= 4:
                text = text.replace(value, "***")
        return text

    def _read_once(self, name: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self.key(name))
            body = response["Body"]
            try:
                return body.read()
            finally:
                body.close()
        except ClientError as exc:
            self._client_error(name, exc)
        except BotoCoreError as exc:
            self._botocore_error(name, exc)

    def _client_error(self, name: str, exc: Any) -> NoReturn:
        response = getattr(exc, "response", None) or {}
        error = response.get("Error") or {}
        code = str(error.get("Code") or "")
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        message = self._scrub(str(error.get("Message") or ""))
        where = self.describe()
        if code == "NoSuchKey" or (status == 404 and code in ("", "404", "NotFound")):
            raise ObjectMissing(name, where)
        if code == "NoSuchBucket":
            raise ObjectUnreadable(name, where, f"bucket {self.bucket!r} does not exist (NoSuchBucket)")
        reason = f"{code or 'error'} (HTTP {status})" + (f": {message}" if message else "")
        if code in _TRANSIENT_CODES or status in (408, 429) or (isinstance(status, int) and status >= 500):
            raise _Transient(reason)
        if code == "AccessDenied":
            reason += (
                "; S3 also answers this for a missing object when the credentials may not list the bucket"
            )
        raise ObjectUnreadable(name, where, reason)

    def _botocore_error(self, name: str, exc: Exception) -> NoReturn:
        from botocore import exceptions as bx

        reason = f"{type(exc).__name__}: {self._scrub(str(exc))}"
        transient: tuple[type[Exception], ...] = (
            bx.ConnectionError,
            bx.HTTPClientError,
            bx.IncompleteReadError,
            bx.CredentialRetrievalError,
        )
        checksum_error = getattr(bx, "FlexibleChecksumError", None)
        if checksum_error is not None:
            transient += (checksum_error,)
        if isinstance(exc, transient):
            raise _Transient(reason)
        if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
            reason += (
                " (give access-key and secret-access-key in the URI, or AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, a profile or an instance role)"
            )
        raise ObjectUnreadable(name, self.describe(), reason)


# --- URIs ----------------------------------------------------------------------------------------

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


def _normal_key(key: str) -> str:
    return unquote(key).strip().lower().replace("_", "-")


def _looks_secret(key: str) -> bool:
    k = _normal_key(key)
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
        key = _normal_key(raw_key)
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


def open_store(uri: str, *, retry: RetryPolicy | None = None) -> ObjectStore:
    """The store for a claim-check root (``file://``, an absolute path, or ``s3://``).

    Does no I/O: a root that does not exist, or a bucket that cannot be reached, shows at the first
    read. Raises :class:`ObjectStoreConfigError`, whose message never contains a secret.
    """
    location = parse_uri(uri)
    if isinstance(location, FileLocation):
        return FileStore(location.root, retry=retry)
    return S3Store(location, retry=retry)
