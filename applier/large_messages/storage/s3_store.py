"""Claim-check objects in an S3 bucket (``s3://`` roots), read with boto3.

boto3 (the optional ``s3`` extra) keeps the standard AWS environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, instance roles, ...): only what the URI gives explicitly is
passed on. No message or log line made here contains an access key, a secret key or a session token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from applier.downstream.url import Secret
from applier.large_messages.storage.base import ObjectStore, check_name
from applier.large_messages.storage.errors import (
    ObjectMissing,
    ObjectStoreConfigError,
    ObjectUnreadable,
    Transient,
)
from applier.large_messages.storage.retry import RetryPolicy
from applier.ops.redact import redact_text, redact_url

INSTALL_HINT: Final = "pip install 'ticdc-applier[s3]'"

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
            raise Transient(reason)
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
            raise Transient(reason)
        if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
            reason += (
                " (give access-key and secret-access-key in the URI, or AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, a profile or an instance role)"
            )
        raise ObjectUnreadable(name, self.describe(), reason)
