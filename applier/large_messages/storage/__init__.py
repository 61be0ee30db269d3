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

Modules: :mod:`.errors`; :mod:`.retry` (the policy); :mod:`.base` (names, the retried read);
:mod:`.file_store`; :mod:`.s3_store`; :mod:`.uri` (parsing the roots); :mod:`.redaction`.
"""

from __future__ import annotations

from applier.large_messages.storage.base import ObjectStore, check_name
from applier.large_messages.storage.errors import (
    ObjectMissing,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectUnreadable,
)
from applier.large_messages.storage.file_store import FileLocation, FileStore
from applier.large_messages.storage.redaction import redacted_uri
from applier.large_messages.storage.retry import RetryPolicy
from applier.large_messages.storage.s3_store import S3Location, S3Store
from applier.large_messages.storage.uri import parse_uri

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


def open_store(uri: str, *, retry: RetryPolicy | None = None) -> ObjectStore:
    """The store for a claim-check root (``file://``, an absolute path, or ``s3://``).

    Does no I/O: a root that does not exist, or a bucket that cannot be reached, shows at the first
    read. Raises :class:`ObjectStoreConfigError`, whose message never contains a secret.
    """
    location = parse_uri(uri)
    if isinstance(location, FileLocation):
        return FileStore(location.root, retry=retry)
    return S3Store(location, retry=retry)
