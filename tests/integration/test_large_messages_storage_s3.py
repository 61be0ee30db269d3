"""The S3 claim-check store against a real S3-compatible server (moto, tests/integration/s3_server.py).

Which credentials a read really used is checked with the server's IAM checks on: it accepts only its
own keys. Failures the server cannot be made to produce on demand (throttling, 5xx, a cut response)
come from a small stub HTTP server that answers GetObject as told.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from applier.large_messages.storage import (
    ObjectMissing,
    ObjectUnreadable,
    RetryPolicy,
    S3Store,
    open_store,
)
from tests.builders import isolate_from_aws_settings
from tests.integration.s3_server import (
    ANY_KEYS,
    Credentials,
    iam_enforced,
    make_bucket,
    put_objects,
    start_s3_server,
    store_uri,
)

pytestmark = pytest.mark.integration  # a server, though neither the broker nor MariaDB

# Short budgets: a failing read gives up in about a second.
QUICK = RetryPolicy(budget=1.0, initial=0.05, maximum=0.2, sdk_attempts=2, connect_timeout=1, read_timeout=5)
OUTER_ONLY = RetryPolicy(
    budget=10, initial=0.02, maximum=0.05, sdk_attempts=1, connect_timeout=1, read_timeout=5
)


@pytest.fixture(autouse=True)
def _no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only what a test sets: the machine's AWS variables and files must not take part."""
    isolate_from_aws_settings(monkeypatch, tmp_path)


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"cc-{uuid.uuid4().hex[:12]}"
    make_bucket(s3_endpoint, name)
    return name


def assert_no_secret(secrets: Credentials, *texts: object) -> None:
    for text in texts:
        for secret in (secrets.secret_key, secrets.session_token):
            if secret:
                assert secret not in str(text), text


# --- reading --------------------------------------------------------------------------------------


def test_reads_objects_under_the_prefix(s3_endpoint: str, bucket: str) -> None:
    big = os.urandom(5 * 1024 * 1024 + 123)
    objects = {"a.json": b'{"k":"v"}', "big.json": big, "empty.json": b""}
    put_objects(s3_endpoint, bucket, "claim-check/cf1", objects)
    put_objects(s3_endpoint, bucket, "", {"top.json": b"top"})
    store = open_store(store_uri(s3_endpoint, bucket, "claim-check/cf1/"))
    assert isinstance(store, S3Store)
    for name, content in objects.items():
        assert store.read(name) == content
    assert open_store(store_uri(s3_endpoint, bucket)).read("top.json") == b"top"
    with pytest.raises(ObjectMissing):
        store.read("top.json")  # only under the prefix


def test_missing_object(s3_endpoint: str, bucket: str) -> None:
    store = open_store(store_uri(s3_endpoint, bucket, "cc"), retry=QUICK)
    started = time.monotonic()
    with pytest.raises(ObjectMissing) as info:
        store.read("5e0c6a52-0000-4000-8000-000000000000.json")
    assert time.monotonic() - started < 1.0  # permanent: not retried
    assert info.value.name == "5e0c6a52-0000-4000-8000-000000000000.json"
    assert info.value.where == f"s3://{bucket}/cc at {s3_endpoint}"
    assert_no_secret(ANY_KEYS, info.value)


def test_wrong_bucket(s3_endpoint: str) -> None:
    store = open_store(store_uri(s3_endpoint, "no-such-bucket-here", "cc"), retry=QUICK)
    with pytest.raises(ObjectUnreadable, match="bucket 'no-such-bucket-here' does not exist") as info:
        store.read("x.json")
    assert not info.value.retried and info.value.attempts == 1


def test_several_threads_share_one_store(s3_endpoint: str, bucket: str) -> None:
    objects = {f"{i:02d}.json": os.urandom(20_000 + 997 * i) for i in range(12)}
    put_objects(s3_endpoint, bucket, "cc", objects)
    store = open_store(store_uri(s3_endpoint, bucket, "cc"))
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(k: int) -> None:
        try:
            start.wait()
            names = sorted(objects)[k % 3 :] + sorted(objects)[: k % 3]
            for _ in range(3):
                for name in names:
                    assert store.read(name) == objects[name]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]


# --- credentials and endpoint -------------------------------------------------------------------------


def test_credentials_from_uri_options_and_from_the_environment(
    s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_objects(s3_endpoint, bucket, "cc", {"x.json": b"payload"})
    with iam_enforced(s3_endpoint) as keys:
        # The server really checks: keys it does not know are refused, at once and for good.
        with pytest.raises(ObjectUnreadable, match="InvalidAccessKeyId") as info:
            open_store(store_uri(s3_endpoint, bucket, "cc", ANY_KEYS), retry=QUICK).read("x.json")
        assert info.value.attempts == 1
        wrong = Credentials(keys.user.access_key, "not-the-secret-" + keys.user.secret_key[:8])
        with pytest.raises(ObjectUnreadable, match="SignatureDoesNotMatch") as info:
            open_store(store_uri(s3_endpoint, bucket, "cc", wrong), retry=QUICK).read("x.json")
        assert_no_secret(wrong, info.value, repr(info.value))

        # URI options.
        assert open_store(store_uri(s3_endpoint, bucket, "cc", keys.user)).read("x.json") == b"payload"
        assert open_store(store_uri(s3_endpoint, bucket, "cc", keys.session)).read("x.json") == b"payload"
        without_token = Credentials(keys.session.access_key, keys.session.secret_key)
        with pytest.raises(ObjectUnreadable):
            open_store(store_uri(s3_endpoint, bucket, "cc", without_token), retry=QUICK).read("x.json")

        # The standard environment, when the URI gives no keys.
        for name, value in keys.session.env().items():
            monkeypatch.setenv(name, value)
        assert open_store(store_uri(s3_endpoint, bucket, "cc", creds=None)).read("x.json") == b"payload"
        monkeypatch.delenv("AWS_SESSION_TOKEN")
        for name, value in keys.user.env().items():
            monkeypatch.setenv(name, value)
        assert open_store(store_uri(s3_endpoint, bucket, "cc", creds=None)).read("x.json") == b"payload"

        # Keys in the URI win over the environment (and are not a fallback: wrong URI keys fail).
        for name, value in ANY_KEYS.env().items():
            monkeypatch.setenv(name, value)
        assert open_store(store_uri(s3_endpoint, bucket, "cc", keys.user)).read("x.json") == b"payload"
        for name, value in keys.user.env().items():
            monkeypatch.setenv(name, value)
        with pytest.raises(ObjectUnreadable, match="InvalidAccessKeyId"):
            open_store(store_uri(s3_endpoint, bucket, "cc", ANY_KEYS), retry=QUICK).read("x.json")


def test_credentials_from_a_profile(
    s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    put_objects(s3_endpoint, bucket, "cc", {"x.json": b"payload"})
    with iam_enforced(s3_endpoint) as keys:
        (tmp_path / "aws-credentials").write_text(
            f"[claimcheck]\naws_access_key_id = {keys.user.access_key}\n"
            f"aws_secret_access_key = {keys.user.secret_key}\n"
        )
        assert open_store(store_uri(s3_endpoint, bucket, "cc", None, profile="claimcheck")).read(
            "x.json"
        ) == (b"payload")
        monkeypatch.setenv("AWS_PROFILE", "claimcheck")
        assert open_store(store_uri(s3_endpoint, bucket, "cc", None)).read("x.json") == b"payload"


def test_no_credentials_anywhere(s3_endpoint: str, bucket: str) -> None:
    with pytest.raises(ObjectUnreadable, match=r"NoCredentialsError.*AWS_ACCESS_KEY_ID") as info:
        open_store(store_uri(s3_endpoint, bucket, "cc", creds=None), retry=QUICK).read("x.json")
    assert info.value.attempts == 1


def test_endpoint_and_region_from_the_environment(
    s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_objects(s3_endpoint, bucket, "cc", {"x.json": b"payload"})
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    for name, value in ANY_KEYS.env().items():
        monkeypatch.setenv(name, value)
    store = open_store(f"s3://{bucket}/cc")
    assert store.read("x.json") == b"payload"
    assert store._client.meta.region_name == "eu-west-1"  # type: ignore[attr-defined]
    # The URI's endpoint wins over the environment's.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert open_store(store_uri(s3_endpoint, bucket, "cc", creds=None)).read("x.json") == b"payload"


# --- transient failures ----------------------------------------------------------------------------------


def refused_endpoint() -> str:
    """An address where nothing listens (a port just released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_unreachable_storage_is_retried_for_the_budget_then_unreadable() -> None:
    secret = Credentials("AKIAUNREACHABLE", "unreachable-Secret+Key/000")
    store = open_store(store_uri(refused_endpoint(), "bkt", "cc", secret), retry=QUICK)
    started = time.monotonic()
    with capture_logs() as logs, pytest.raises(ObjectUnreadable) as info:
        store.read("x.json")
    elapsed = time.monotonic() - started
    assert info.value.retried and info.value.attempts >= 2
    assert "EndpointConnectionError" in info.value.reason and "retried" in str(info.value)
    assert 0.5 < elapsed < QUICK.budget + 5
    # One warning, then debug lines (kept only when debug is on), then one error.
    retries = [e for e in logs if e["event"] == "object store read failed, retrying"]
    assert retries[0]["log_level"] == "warning" and retries[0]["attempt"] == 1
    assert all(e["log_level"] == "debug" for e in retries[1:])
    assert logs[-1]["event"] == "object store read failed for the whole retry budget"
    assert logs[-1]["log_level"] == "error"
    assert_no_secret(secret, info.value, *(repr(e) for e in logs))


def test_a_storage_outage_shorter_than_the_budget_is_ridden_out(s3_endpoint: str, bucket: str) -> None:
    put_objects(s3_endpoint, bucket, "cc", {"x.json": b"payload"})
    server = start_s3_server()  # a second server on the same moto state, to stop and start
    try:
        store = open_store(
            store_uri(server.endpoint, bucket, "cc"),
            retry=RetryPolicy(budget=20, initial=0.1, maximum=0.5, sdk_attempts=2, connect_timeout=1),
        )
        assert store.read("x.json") == b"payload"
        server.stop()
        restart = threading.Timer(1.5, server.start)
        started = time.monotonic()
        restart.start()
        try:
            assert store.read("x.json") == b"payload"
        finally:
            restart.join()
        assert time.monotonic() - started >= 1.0
    finally:
        server.stop()


class _Stub(ThreadingHTTPServer):
    """Answers GET n (1-based) with ``answer(n)``: (status, error code or None, body)."""

    daemon_threads = True

    def __init__(self, answer: Callable[[int], tuple[int, str | None, bytes]]) -> None:
        super().__init__(("127.0.0.1", 0), _StubHandler)
        self.answer = answer
        self.requests = 0
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _StubHandler(BaseHTTPRequestHandler):
    server: _Stub

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests += 1
            n = self.server.requests
        status, code, body = self.server.answer(n)
        if code is not None:
            body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>stub</Message></Error>".encode()
        length = len(body)
        if status == 0:  # a response cut short: announce more than is sent, then close
            status, length = 200, len(body) * 2
        self.send_response(status)
        self.send_header("Content-Type", "application/xml" if code else "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[Callable[[Callable[[int], tuple[int, str | None, bytes]]], _Stub]]:
    servers: list[_Stub] = []

    def make(answer: Callable[[int], tuple[int, str | None, bytes]]) -> _Stub:
        server = _Stub(answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (503, "SlowDown"),
        (500, "InternalError"),
        (502, None),
        (429, "TooManyRequests"),
        (400, "RequestTimeout"),
        (0, None),
    ],
)
def test_transient_answers_are_retried(stub, status: int, code: str | None) -> None:
    server = stub(lambda n: (status, code, b"partial") if n <= 2 else (200, None, b"payload"))
    store = open_store(store_uri(server.endpoint, "bkt", "cc"), retry=OUTER_ONLY)
    assert store.read("x.json") == b"payload"
    assert server.requests == 3


def test_botocore_retries_inside_each_attempt(stub) -> None:
    server = stub(lambda n: (503, "SlowDown", b"") if n <= 3 else (200, None, b"payload"))
    policy = RetryPolicy(budget=10, initial=0.02, maximum=0.05, sdk_attempts=2, connect_timeout=1)
    assert open_store(store_uri(server.endpoint, "bkt", "cc"), retry=policy).read("x.json") == b"payload"
    assert server.requests == 4  # two reads of two requests each failed, the third read's first succeeded


def test_server_errors_for_the_whole_budget(stub) -> None:
    # One request per attempt. With QUICK, botocore retries inside each attempt after a random
    # back-off of up to a second, which can use up the whole budget in the first attempt on a slow
    # machine: the outer loop then retried nothing (seen once in a full run).
    policy = RetryPolicy(
        budget=1.0, initial=0.05, maximum=0.2, sdk_attempts=1, connect_timeout=1, read_timeout=5
    )
    server = stub(lambda n: (503, "SlowDown", b""))
    with pytest.raises(ObjectUnreadable, match="SlowDown") as info:
        open_store(store_uri(server.endpoint, "bkt", "cc"), retry=policy).read("x.json")
    assert info.value.retried and server.requests >= 2


@pytest.mark.parametrize(
    ("status", "code"), [(403, "AccessDenied"), (400, "InvalidRequest"), (403, "AllAccessDisabled")]
)
def test_permanent_answers_are_not_retried(stub, status: int, code: str) -> None:
    server = stub(lambda n: (status, code, b""))
    with pytest.raises(ObjectUnreadable, match=code) as info:
        open_store(store_uri(server.endpoint, "bkt", "cc"), retry=OUTER_ONLY).read("x.json")
    assert server.requests == 1 and not info.value.retried
    if code == "AccessDenied":
        assert "missing object" in info.value.reason  # S3 answers 403 for it without ListBucket


def test_not_found_without_a_code_is_a_missing_object(stub) -> None:
    server = stub(lambda n: (404, None, b""))
    with pytest.raises(ObjectMissing):
        open_store(store_uri(server.endpoint, "bkt", "cc"), retry=OUTER_ONLY).read("x.json")
    assert server.requests == 1
