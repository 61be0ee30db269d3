"""A real S3-compatible server for the tests: moto's ``ThreadedMotoServer`` on 127.0.0.1, a free port.

In the test process on purpose: moto keeps its buckets in the process, so a server stopped and
started again on the same port (a storage outage in the middle of a read) still has them.

The session fixture ``s3_endpoint`` (tests/integration/conftest.py) is the URL of one such server.
It accepts any access key while IAM checks are off (the default), but requests must still be signed:
give some keys, e.g. :data:`ANY_KEYS` through :func:`store_uri`. :func:`iam_enforced` turns moto's IAM
checks on for a block, so that a test can tell which credentials a client really sent.

Nothing here skips: boto3 and moto come with the ``test`` extra, and a server that does not start
fails the test.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import boto3
from botocore.config import Config
from moto.server import ThreadedMotoServer

REGION = "us-east-1"


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str
    secret_key: str
    session_token: str | None = None

    def env(self) -> dict[str, str]:
        """The standard AWS environment variables for these keys."""
        out = {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        if self.session_token:
            out["AWS_SESSION_TOKEN"] = self.session_token
        return out


ANY_KEYS = Credentials("applier-test-key", "applier-test-secret")
"""Keys for the server while IAM checks are off (it accepts any)."""


@dataclass(frozen=True, slots=True)
class IamKeys:
    """Credentials the server accepts while :func:`iam_enforced` is on."""

    user: Credentials  # an IAM user's access key pair, allowed everything
    session: Credentials  # temporary credentials (with a session token) of a role allowed everything


class S3Server:
    """One moto server thread on ``127.0.0.1:port`` (0: a free port, known after :meth:`start`)."""

    def __init__(self, port: int = 0) -> None:
        self._port = port
        self._server: ThreadedMotoServer | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the S3 server is not running")
        host, port = self._server.get_host_and_port()
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        return self._server.get_host_and_port()[1] if self._server is not None else self._port

    def start(self, timeout: float = 15.0) -> S3Server:
        """Start serving; fails (never hangs) when the port cannot be bound within ``timeout``."""
        if self._server is not None:
            return self
        # werkzeug logs every request at INFO level: keep the tests' output readable.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self._port, verbose=False)
        # ThreadedMotoServer.start waits for the bind without a timeout, and a failed bind ends its
        # thread without telling: wait for it in a helper thread instead.
        starter = threading.Thread(target=server.start, name="moto-start", daemon=True)
        starter.start()
        starter.join(timeout)
        if starter.is_alive():
            raise RuntimeError(f"moto S3 server did not start on 127.0.0.1:{self._port} within {timeout} s")
        self._server = server
        self._port = self.port
        return self

    def stop(self) -> None:
        """Stop serving (the buckets stay in moto's memory); :meth:`start` serves them again."""
        if self._server is not None:
            self._server.stop()
            self._server = None


def start_s3_server(port: int = 0) -> S3Server:
    return S3Server(port).start()


def client(endpoint: str, service: str = "s3", creds: Credentials = ANY_KEYS) -> Any:
    """A boto3 client for ``service`` on the test server, independent of the AWS environment: the
    session says who and where, the client what and how."""
    session = boto3.session.Session(
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
        aws_session_token=creds.session_token,
        region_name=REGION,
    )
    config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})
    return session.client(service, endpoint_url=endpoint, config=config)


def make_bucket(endpoint: str, name: str) -> None:
    """Create bucket ``name`` (IAM checks must be off, as they are outside :func:`iam_enforced`)."""
    client(endpoint).create_bucket(Bucket=name)


def put_objects(endpoint: str, bucket: str, prefix: str, objects: Mapping[str, bytes]) -> None:
    """Put each ``name: content`` as ``prefix/name`` (just ``name`` for an empty prefix)."""
    s3 = client(endpoint)
    prefix = prefix.strip("/")
    for name, content in objects.items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{name}" if prefix else name, Body=content)


def store_uri(
    endpoint: str | None,
    bucket: str,
    prefix: str = "",
    creds: Credentials | None = ANY_KEYS,
    **options: str,
) -> str:
    """An ``s3://`` claim-check root for the test server, as an operator would write it.

    ``endpoint`` None leaves it to the environment (``AWS_ENDPOINT_URL``); ``creds`` None leaves the
    keys to the environment. ``options`` are added as they are (``force_path_style="true"``).
    """
    query: dict[str, str] = {}
    if endpoint is not None:
        query["endpoint"] = endpoint
    if creds is not None:
        query["access-key"] = creds.access_key
        query["secret-access-key"] = creds.secret_key
        if creds.session_token:
            query["session-token"] = creds.session_token
    query.update({k.replace("_", "-"): v for k, v in options.items()})
    root = f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"
    if not query:
        return root
    return root + "?" + "&".join(f"{k}={quote(v, safe=':/')}" for k, v in query.items())


def client_env(endpoint: str, creds: Credentials = ANY_KEYS) -> dict[str, str]:
    """The environment an S3 client outside this process needs for the test server (a broker
    storing its topics there): endpoint, plain HTTP allowed, region and keys, under the names the
    AWS SDKs and the ``object_store`` crate read."""
    return {
        "AWS_ENDPOINT": endpoint,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        **creds.env(),
    }


def _set_auth(endpoint: str, unauthenticated_requests: float) -> None:
    """moto's switch: IAM checks start after this many more requests (inf: never)."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=str(unauthenticated_requests).encode(),
        headers={"Content-Type": "text/plain"},  # a form type would leave moto an empty body
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


_ALLOW_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
)
_TRUST_ACCOUNT = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
)


@contextmanager
def iam_enforced(endpoint: str) -> Iterator[IamKeys]:
    """Inside the block the server checks every request's signature and IAM policy: only the yielded
    keys are accepted (wrong ones get 403). Create buckets and objects before entering."""
    name = f"applier-test-{uuid.uuid4().hex[:8]}"
    iam = client(endpoint, "iam")
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="all", PolicyDocument=_ALLOW_ALL)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=_TRUST_ACCOUNT)["Role"]
    iam.put_role_policy(RoleName=name, PolicyName="all", PolicyDocument=_ALLOW_ALL)
    temp = client(endpoint, "sts").assume_role(RoleArn=role["Arn"], RoleSessionName=name)["Credentials"]
    keys = IamKeys(
        user=Credentials(key["AccessKeyId"], key["SecretAccessKey"]),
        session=Credentials(temp["AccessKeyId"], temp["SecretAccessKey"], temp["SessionToken"]),
    )
    _set_auth(endpoint, 0)
    try:
        yield keys
    finally:
        _set_auth(endpoint, float("inf"))
