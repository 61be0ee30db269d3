"""Claim-check object storage without a server: the file store, root URIs, names and redaction.

The S3 store against a real S3-compatible server: tests/integration/test_large_messages_storage_s3.py.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from applier.codec.events import claim_check_name
from applier.errors import ConfigurationError
from applier.large_messages.storage import (
    FileLocation,
    FileStore,
    ObjectMissing,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectUnreadable,
    RetryPolicy,
    S3Location,
    S3Store,
    check_name,
    open_store,
    parse_uri,
    redacted_uri,
)
from tests.builders import isolate_from_aws_settings

AK = "AKIAEXAMPLEKEY0001"
SK = "wJalr/XUtnFEMI+K7MDENG=bPxRfiCYSECRET"
TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN+/="
FAST = RetryPolicy(budget=0.5, initial=0.01, maximum=0.05)


@pytest.fixture(autouse=True)
def _no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The machine's AWS settings must not leak into what the parser and boto3 see."""
    isolate_from_aws_settings(monkeypatch, tmp_path)


def assert_no_secret(*texts: object) -> None:
    for text in texts:
        for secret in (AK, SK, TOKEN, SK.split("+")[0]):
            assert secret not in str(text), text


# --- names -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "../x.json", "/etc/passwd", "a\\b", "x\0.json", "dir/"]
)
def test_names_that_are_not_plain_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "x.json").write_bytes(b"{}")
    with pytest.raises(ValueError, match="plain object name"):
        FileStore(str(tmp_path)).read(name)
    with pytest.raises(ValueError):
        check_name(name)


def test_a_name_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(ValueError, match="string"):
        check_name(b"x.json")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("location", "name"),
    [
        (
            "file:///tmp/claim-check/6f1c0a5e-1b2c-4d5e-8f90-a1b2c3d4e5f6.json",
            "6f1c0a5e-1b2c-4d5e-8f90-a1b2c3d4e5f6.json",
        ),
        ("s3://bucket/prefix/x.json", "x.json"),
        ("/etc/passwd", "passwd"),
        ("../../etc/shadow", "shadow"),
        ("z.json", "z.json"),
    ],
)
def test_object_name_keeps_only_the_base_name(location: str, name: str) -> None:
    assert claim_check_name(location) == name


@pytest.mark.parametrize("location", ["", "s3://bucket/prefix/", "file:///x/..", "/a/.", "C:\\claim\\y.json"])
def test_object_name_without_a_usable_base_name(location: str) -> None:
    with pytest.raises(ValueError):
        claim_check_name(location)


# --- the file store ----------------------------------------------------------------------------------


def test_file_store_reads_objects_under_its_root(tmp_path: Path) -> None:
    big = os.urandom(3 * 1024 * 1024 + 7)
    (tmp_path / "a.json").write_bytes(b'{"k":1}')
    (tmp_path / "big.json").write_bytes(big)
    store = open_store(f"file://{tmp_path}")
    assert isinstance(store, FileStore) and store.root == str(tmp_path)
    assert store.read("a.json") == b'{"k":1}'
    assert store.read("big.json") == big
    assert store.read("a.json") == b'{"k":1}'  # nothing is consumed


def test_file_store_missing_object(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    with pytest.raises(ObjectMissing) as info:
        store.read("gone.json")
    assert isinstance(info.value, ObjectStoreError)
    assert info.value.name == "gone.json"
    assert info.value.where == f"file://{tmp_path}"
    assert "'gone.json'" in str(info.value) and str(tmp_path) in str(info.value)


def test_file_store_root_that_does_not_exist_is_not_a_missing_object(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path / "not-mounted"))
    with pytest.raises(ObjectUnreadable, match="root directory does not exist"):
        store.read("x.json")


def test_file_store_root_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ObjectUnreadable, match="errno"):
        FileStore(str(tmp_path / "file")).read("x.json")


def test_a_directory_in_place_of_an_object_is_unreadable(tmp_path: Path) -> None:
    (tmp_path / "d.json").mkdir()
    with pytest.raises(ObjectUnreadable, match="not a regular file") as info:
        FileStore(str(tmp_path), retry=FAST).read("d.json")
    assert not info.value.retried and info.value.attempts == 1


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.json")
    result: list[BaseException] = []

    def read() -> None:
        try:
            FileStore(str(tmp_path)).read("f.json")
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert isinstance(result[0], ObjectUnreadable) and "not a regular file" in str(result[0])


def test_a_symbolic_link_in_place_of_an_object_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"private")
    root = tmp_path / "root"
    root.mkdir()
    (root / "x.json").symlink_to(outside)
    with pytest.raises(ObjectUnreadable, match="symbolic link"):
        FileStore(str(root)).read("x.json")


def test_the_root_may_be_a_symbolic_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "x.json").write_bytes(b"ok")
    (tmp_path / "mount").symlink_to(tmp_path / "real")
    assert FileStore(str(tmp_path / "mount")).read("x.json") == b"ok"


def test_permission_denied_is_unreadable_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run as root, where chmod blocks nothing: the error is injected."""
    (tmp_path / "x.json").write_bytes(b"{}")
    calls = []

    def denied(path: str, flags: int, *args: object) -> int:
        calls.append(path)
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(ObjectUnreadable, match="Permission denied") as info:
        FileStore(str(tmp_path), retry=FAST).read("x.json")
    assert len(calls) == 1 and not info.value.retried


def test_transient_io_errors_are_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x.json").write_bytes(b"content")
    real_open = os.open
    failures = [errno.EIO, errno.ESTALE]

    def flaky(path: str, flags: int, *args: object) -> int:
        if failures:
            code = failures.pop(0)
            raise OSError(code, os.strerror(code), path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", flaky)
    with capture_logs() as logs:
        assert FileStore(str(tmp_path), retry=RetryPolicy(budget=5, initial=0.01, maximum=0.02)).read(
            "x.json"
        ) == (b"content")
    assert not failures
    retries = [e for e in logs if e["event"] == "object store read failed, retrying"]
    # One warning per read; the second retry only at debug level (dropped when debug is off).
    assert retries[0]["log_level"] == "warning" and retries[0]["attempt"] == 1
    assert [e["log_level"] for e in retries[1:]] in ([], ["debug"])


def test_transient_errors_give_up_after_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x.json").write_bytes(b"content")

    def broken(path: str, flags: int, *args: object) -> int:
        raise OSError(errno.EIO, "Input/output error", path)

    monkeypatch.setattr(os, "open", broken)
    with pytest.raises(ObjectUnreadable) as info:
        FileStore(str(tmp_path), retry=FAST).read("x.json")
    assert info.value.retried and info.value.attempts > 1
    assert "Input/output error" in info.value.reason and "retried" in str(info.value)


def test_a_zero_budget_makes_one_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path: str, flags: int, *args: object) -> int:
        raise OSError(errno.EIO, "Input/output error", path)

    monkeypatch.setattr(os, "open", broken)
    with pytest.raises(ObjectUnreadable) as info:
        FileStore(str(tmp_path), retry=RetryPolicy(budget=0)).read("x.json")
    assert info.value.attempts == 1 and not info.value.retried


def test_file_store_is_safe_to_share_between_threads(tmp_path: Path) -> None:
    contents = {f"{i}.json": os.urandom(1000 + i) for i in range(40)}
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    store = FileStore(str(tmp_path))
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for name, data in contents.items():
                assert store.read(name) == data
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# --- root URIs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "root"),
    [
        ("file:///data/claim-check", "/data/claim-check"),
        ("file:////data/claim-check", "/data/claim-check"),
        ("file:///data/claim-check/", "/data/claim-check"),
        ("file://localhost/data/cc", "/data/cc"),
        ("FILE:///data/cc", "/data/cc"),
        ("local:///data/cc", "/data/cc"),
        ("file:///data/with%20space", "/data/with space"),
        ("/data/claim-check", "/data/claim-check"),
        ("//data//claim-check/./", "/data/claim-check"),
        ("  file:///data/cc  ", "/data/cc"),
    ],
)
def test_file_roots(uri: str, root: str) -> None:
    assert parse_uri(uri) == FileLocation(root)
    assert open_store(uri).describe() == f"file://{root}"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("data/claim-check", "file:///absolute/path"),
        ("file://data/claim-check", "names a host"),
        ("file://", "absolute path"),
        ("file:relative", "file:///absolute/path"),
        ("file:///data/cc?x=1", "no options"),
        ("gs://bucket/prefix", "'gs' is not supported"),
        ("azure://container/x", "not supported"),
        ("http://minio:9000/bucket", "not supported"),
    ],
)
def test_bad_roots(uri: str, message: str) -> None:
    with pytest.raises(ObjectStoreConfigError, match=message) as info:
        open_store(uri)
    assert isinstance(info.value, ConfigurationError) and not isinstance(info.value, ValueError)


def test_file_store_needs_an_absolute_root() -> None:
    with pytest.raises(ObjectStoreConfigError):
        FileStore("relative/dir")


def test_s3_root_forms() -> None:
    assert parse_uri("s3://bucket") == S3Location(bucket="bucket")
    loc = parse_uri("s3://bucket/a/b/")
    assert isinstance(loc, S3Location)
    assert (loc.bucket, loc.prefix, loc.endpoint, loc.region, loc.profile) == (
        "bucket",
        "a/b",
        None,
        None,
        None,
    )
    assert loc.addressing_style == "path"  # TiDB's default for URIs
    assert not loc.access_key and not loc.secret_key and not loc.session_token
    assert parse_uri("S3://Bucket_Old.Style/p").bucket == "Bucket_Old.Style"  # type: ignore[union-attr]


def test_s3_options_are_named_as_tidb_names_them() -> None:
    loc = parse_uri(
        f"s3://bkt/cc?Endpoint=http://minio:9000/&REGION=eu-west-1&Access_Key={AK}&secret_access_key={SK}"
        f"&session-token={TOKEN}&force_path_style=false&profile=prod&storage-class=STANDARD&sse=aws:kms"
        "&sse-kms-key-id=k&acl=private&object-lock-enabled=true"
    )
    assert isinstance(loc, S3Location)
    assert loc.endpoint == "http://minio:9000"
    assert loc.region == "eu-west-1"
    assert loc.access_key.reveal() == AK
    assert loc.secret_key.reveal() == SK  # '+' is a plus, as in TiDB
    assert loc.session_token.reveal() == TOKEN
    assert loc.addressing_style == "virtual"
    assert loc.profile == "prod"
    assert_no_secret(repr(loc), loc.describe())


def test_percent_encoded_secret() -> None:
    loc = parse_uri("s3://bkt?access-key=a&secret-access-key=x%2By%2Fz%3D%23")
    assert loc.secret_key.reveal() == "x+y/z=#"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("query", "style"),
    [
        ("", "path"),
        ("&force-path-style=true", "path"),
        ("&force-path-style=1", "path"),
        ("&force-path-style=False", "virtual"),
        ("&force-path-style=0", "virtual"),
        ("&endpoint=https://s3.eu-west-1.amazonaws.com", "virtual"),
        ("&endpoint=https://s3.eu-west-1.amazonaws.com&force-path-style=true", "path"),
        ("&provider=aws", "virtual"),
        ("&provider=alibaba", "virtual"),
        ("&provider=tencent", "virtual"),
        ("&provider=ceph", "path"),
        ("&provider=minio&endpoint=http://minio:9000", "path"),
        ("&use-accelerate-endpoint=true", "virtual"),
    ],
)
def test_addressing_style_follows_tidb(query: str, style: str) -> None:
    loc = parse_uri(f"s3://bkt/p?region=us-east-1{query}")
    assert loc.addressing_style == style  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3://", "needs a bucket"),
        ("s3:///prefix", "needs a bucket"),
        ("s3://bucket:9000/p", "needs a bucket"),
        (f"s3://{AK}:{SK.replace('/', '%2F')}@bucket/p", "before the bucket name are not supported"),
        (f"s3://bkt/p?secret-access-key={SK}#frag", "'#'"),
        (f"s3://bkt/p?bogus={SK}", "unknown claim-check storage option 'bogus'"),
        (f"s3://bkt/p?secret_acces_key={SK}", "unknown claim-check storage option 'secret-acces-key'"),
        ("s3://bkt/p?role-arn=arn:aws:iam::1:role/x", "role-arn is not supported"),
        ("s3://bkt/p?external_id=x", "external-id is not supported"),
        ("s3://bkt/p?region=a&Region=b", "given twice"),
        (f"s3://bkt/p?access-key={AK}", "must be given together"),
        (f"s3://bkt/p?secret-access-key={SK}", "must be given together"),
        (f"s3://bkt/p?session-token={TOKEN}", "needs access-key"),
        ("s3://bkt/p?force-path-style=yes", "force-path-style must be true or false"),
        ("s3://bkt/p?use-accelerate-endpoint=maybe", "must be true or false"),
        ("s3://bkt/p?use-accelerate-endpoint=true&force-path-style=true", "exclude each other"),
        ("s3://bkt/p?endpoint=minio:9000", "http:// or https://"),
        ("s3://bkt/p?endpoint=ftp://minio", "http:// or https://"),
        ("s3://bkt/p?endpoint=http://minio:90x0", "http:// or https://"),
        (f"s3://bkt/p?endpoint=http://{AK}@minio:9000", "must not contain credentials"),
        (
            f"s3://bkt/p?endpoint=http://{AK}:{SK.replace('/', '%2F')}@minio:9000",
            "must not contain credentials",
        ),
    ],
)
def test_bad_s3_roots(uri: str, message: str) -> None:
    with pytest.raises(ObjectStoreConfigError, match=message) as info:
        open_store(uri)
    assert_no_secret(str(info.value), repr(info.value))


def test_empty_option_values_count_as_not_given() -> None:
    loc = parse_uri("s3://bkt?region=&endpoint=&access-key=&secret-access-key=")
    assert loc == S3Location(bucket="bkt")


# --- the S3 client (made, not used: no server here) ----------------------------------------------------


def test_s3_store_passes_only_what_the_uri_gives() -> None:
    store = open_store(
        f"s3://bkt/cc?endpoint=http://127.0.0.1:9/&region=eu-west-2&access-key={AK}&secret-access-key={SK}"
        f"&session-token={TOKEN}",
        retry=RetryPolicy(sdk_attempts=4, connect_timeout=2, read_timeout=7),
    )
    assert isinstance(store, S3Store)
    meta = store._client.meta
    assert meta.endpoint_url == "http://127.0.0.1:9"
    assert meta.region_name == "eu-west-2"
    assert meta.config.s3["addressing_style"] == "path"
    assert meta.config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert (meta.config.connect_timeout, meta.config.read_timeout) == (2, 7)
    creds = store._client._get_credentials()
    assert (creds.access_key, creds.secret_key, creds.token) == (AK, SK, TOKEN)
    assert store.key("x.json") == "cc/x.json"
    assert open_store("s3://bkt?region=us-east-1").key("x.json") == "x.json"  # type: ignore[attr-defined]
    assert_no_secret(repr(store), store.describe(), str(store))


def test_s3_store_takes_endpoint_and_region_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:19000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    store = open_store("s3://bkt/cc")
    assert store._client.meta.endpoint_url == "http://127.0.0.1:19000"  # type: ignore[attr-defined]
    assert store._client.meta.region_name == "ap-south-1"  # type: ignore[attr-defined]
    store = open_store("s3://bkt/cc?endpoint=http://127.0.0.1:29000&region=eu-north-1")
    assert store._client.meta.endpoint_url == "http://127.0.0.1:29000"  # type: ignore[attr-defined]
    assert store._client.meta.region_name == "eu-north-1"  # type: ignore[attr-defined]


def test_an_unknown_profile_is_a_config_error() -> None:
    with pytest.raises(ObjectStoreConfigError, match="cannot set up the S3 client"):
        open_store("s3://bkt/cc?profile=nosuchprofile")


def test_without_boto3_an_s3_root_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # makes `import boto3` fail
    with pytest.raises(ObjectStoreConfigError, match=r"pip install 'ticdc-applier\[s3\]'"):
        open_store("s3://bkt/cc")
    assert open_store("file:///data/cc").describe() == "file:///data/cc"  # file roots need no boto3


# --- redaction --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            f"s3://bkt/cc?endpoint=http://minio:9000&access-key={AK}&secret-access-key={SK}&region=x",
            "s3://bkt/cc?endpoint=http://minio:9000&access-key=***&secret-access-key=***&region=x",
        ),
        (
            f"s3://bkt/cc?Secret_Access_Key={SK}&session_token={TOKEN}",
            "s3://bkt/cc?Secret_Access_Key=***&session_token=***",
        ),
        (f"s3://bkt/cc?secret%2Daccess%2Dkey={SK}", "s3://bkt/cc?secret%2Daccess%2Dkey=***"),
        (f"s3://bkt/cc?secret_acces_key={SK}&x=1", "s3://bkt/cc?secret_acces_key=***&x=1"),
        (f"s3://{AK}:{SK}@bkt/cc", "s3://***@bkt/cc"),
        (f"s3://{AK}@bkt/cc", "s3://***@bkt/cc"),
        ("file:///data/claim-check", "file:///data/claim-check"),
        (
            "s3://bkt/cc?region=us-east-1&force-path-style=true",
            "s3://bkt/cc?region=us-east-1&force-path-style=true",
        ),
    ],
)
def test_redacted_uri(uri: str, expected: str) -> None:
    assert redacted_uri(uri) == expected
    assert_no_secret(redacted_uri(uri))


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://bkt/cc?secret-access-key={SK}#{SK}",
        f"s3://{AK}:S?K#{SK}@bkt/cc",
        f"s3://bkt/cc?endpoint=http://user:{SK}@minio:9000&access-key={AK}",
        f"s3://[bkt/cc?secret-access-key={SK}",  # does not parse
        f"s3://bkt/cc?token={TOKEN}&password={SK}",
    ],
)
def test_redacted_uri_never_shows_a_secret(uri: str) -> None:
    assert_no_secret(redacted_uri(uri))


def test_errors_and_representations_hold_no_secret(tmp_path: Path) -> None:
    uri = f"s3://bkt/cc?endpoint=http://127.0.0.1:9&access-key={AK}&secret-access-key={SK}&session-token={TOKEN}"
    store = open_store(uri)
    loc = parse_uri(uri)
    texts: list[object] = [repr(store), str(store), store.describe(), repr(loc), str(loc), loc.describe()]
    texts += [ObjectMissing("x.json", store.describe()), ObjectUnreadable("x.json", store.describe(), "r")]
    assert_no_secret(*texts)
    scrubbed = store._scrub(f"signature for {AK} with {SK} and {TOKEN} at http://u:{SK}@h")  # type: ignore[attr-defined]
    assert_no_secret(scrubbed)


def test_retry_policy_is_checked() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(budget=-1)
    with pytest.raises(ValueError):
        RetryPolicy(initial=2, maximum=1)
    with pytest.raises(ValueError):
        RetryPolicy(sdk_attempts=0)
