"""librdkafka's log lines and error events in the structured log: one event per condition, repeats counted.

librdkafka reports a broker it cannot reach at every reconnect attempt (every 50 ms or so), as a
log line and again as an error event: left alone, 8 s of outage were ~300 raw ``%3|...|FAIL|...``
lines on stderr, outside the structured log. Every Kafka client of the project is therefore made
with :meth:`KafkaClientLog.install`: confluent-kafka then hands librdkafka's log lines to a
``logging.Logger`` and its error events to ``error_cb``, both served by the client's own
``poll``/``consume`` on the thread that calls it, and nothing reaches stderr directly.

What is logged (docs/operations.md, "Kafka client messages"):

* A *condition* is a kind (the librdkafka log facility, or the error code's name such as
  ``_TRANSPORT``) and the broker its text names. Its first occurrence is one event at the level
  librdkafka gave it (syslog levels: 0-3 error, 4 warning, 5-6 info, 7 debug; error events:
  error when fatal, warning otherwise). Later occurrences are counted, and a summary ("repeated
  N times") is logged at most every ``SUMMARY_SECONDS`` while they go on; a condition quiet for
  that long is news again when it recurs.
* ``FAIL`` log lines repeat what the error event of the same failure says: they are debug.
* All brokers unreachable (``_ALL_BROKERS_DOWN``, which librdkafka raises once, when the last
  broker connection fails) is one warning; :attr:`KafkaClientLog.unreachable_since` then says
  since when, for ``/readyz`` and ``applier_kafka_unreachable_seconds``. It ends when a broker is
  ``UP`` again in librdkafka's statistics (taken every ``statistics.interval.ms``): one info event,
  "broker reachable again after N s", with the repeats folded into it. A delivered record is no
  such sign: it may have been fetched before the outage and waited in the client's queue.
* ``quiet`` clients (the catch-up's Spark executors, whose output nobody configures) log nothing
  and keep only :attr:`KafkaClientLog.last_error`, which their exceptions quote.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import KafkaError

from applier.ops.logs import get_logger

SUMMARY_SECONDS = 30.0
"""At most one summary per condition in this many seconds."""
STATISTICS_INTERVAL_MS = 1000
"""librdkafka's statistics interval unless ``kafka_config`` sets another (not 0): only read while
no broker is reachable, to see one come back; cheap otherwise (the callback returns at once)."""

_METHOD_BY_LEVEL = ((logging.ERROR, "error"), (logging.WARNING, "warning"), (logging.INFO, "info"))
_THREAD_PREFIX = re.compile(r"^\[thrd:[^\]]*\]:\s*")
_BROKER = re.compile(r"^((?:\w+://)?\S+?:\d+/\w+|GroupCoordinator):\s")
_UNREACHABLE = KafkaError._ALL_BROKERS_DOWN


def log_method(level: int) -> str:
    """structlog method for a Python logging level (confluent-kafka maps librdkafka's syslog
    levels onto those: 0-2 CRITICAL, 3 ERROR, 4 WARNING, 5-6 INFO, 7 DEBUG)."""
    for floor, name in _METHOD_BY_LEVEL:
        if level >= floor:
            return name
    return "debug"


def broker_of(text: str) -> str | None:
    """The broker a librdkafka message is about (``host:port/id``), None when it names none."""
    m = _BROKER.match(text)
    return m.group(1) if m else None


def _named(broker: str | None) -> dict[str, str]:
    return {} if broker is None else {"broker": broker}


@dataclass
class _Seen:
    """A condition since its last line: when that was, how often it came since, the last text."""

    logged_at: float
    method: str
    text: str
    count: int = 0


class _Handler(logging.Handler):
    """Receives confluent-kafka's ``logger.log(level, "%s [%s] %s", facility, client, text)``."""

    def __init__(self, owner: KafkaClientLog) -> None:
        super().__init__(logging.DEBUG)
        self._owner = owner

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if isinstance(args, tuple) and len(args) == 3:
            facility, _client, text = (str(a) for a in args)
        else:
            facility, text = "LOG", record.getMessage()
        self._owner.on_log(record.levelno, facility, text)


class KafkaClientLog:
    """The log, error and statistics callbacks of one Kafka client (see the module docstring).

    ``log``: a structlog logger (default: component ``kafka``); ``clock``: monotonic seconds.
    Callbacks run on the thread that polls the client; the HTTP thread only reads
    ``unreachable_since`` and ``last_error`` (plain attributes).
    """

    def __init__(
        self,
        log: Any = None,
        *,
        summary_seconds: float = SUMMARY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        quiet: bool = False,
    ) -> None:
        self._log = log if log is not None else get_logger(component="kafka")
        self.summary_seconds = float(summary_seconds)
        self._clock = clock
        self.quiet = quiet
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str | None], _Seen] = {}
        self.unreachable_since: float | None = None
        self.last_error: str | None = None
        self.refused: str | None = None  # a broker refused the client's authentication (SASL)
        self.trace = False  # librdkafka's ``debug`` is set: its debug lines are wanted one by one
        self.logger = logging.Logger("applier.kafka.client", logging.DEBUG)  # not in logging's tree
        self.logger.propagate = False
        self.logger.addHandler(_Handler(self))

    def install(self, conf: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        """Add the callbacks to a librdkafka configuration (returned, changed in place)."""
        conf["logger"] = self.logger
        conf["error_cb"] = self.on_error
        # An operator who sets librdkafka's `debug` contexts asks for its trace: every debug line,
        # not one per condition.
        self.trace = bool(conf.get("debug"))
        conf["stats_cb"] = self.on_stats
        # Without statistics a recovery would go unseen: 0 (off) is not an option here.
        interval = int(conf.get("statistics.interval.ms") or 0)
        conf["statistics.interval.ms"] = interval or STATISTICS_INTERVAL_MS
        return conf

    # -- callbacks -------------------------------------------------------------------------------
    def on_log(self, level: int, facility: str, text: str) -> None:
        text = _THREAD_PREFIX.sub("", text)
        method = "debug" if facility == "FAIL" else log_method(level)
        if self.trace and method == "debug" and facility != "FAIL":
            if not self.quiet:
                self._log.debug("kafka: " + text, kind=facility, **_named(broker_of(text)))
            return
        self._occurred(facility, text, method)

    def on_error(self, err: KafkaError) -> None:
        text = err.str()
        self.last_error = text
        if err.code() == KafkaError._AUTHENTICATION:
            self.refused = text
        if err.code() == _UNREACHABLE and self.unreachable_since is None:
            self.unreachable_since = now = self._clock()
            with self._lock:  # later reports of the same outage are repeats of this line
                self._seen[(err.name(), None)] = _Seen(now, "warning", text)
            if not self.quiet:
                self._log.warning(
                    "kafka: no broker reachable; the client retries until one answers",
                    kind=err.name(),
                    detail=text,
                )
            return
        self._occurred(err.name(), text, "error" if err.fatal() else "warning")

    def on_stats(self, stats: str) -> None:
        """librdkafka's statistics (JSON): only looked at while no broker is reachable."""
        if self.unreachable_since is None:
            return
        try:
            brokers = orjson.loads(stats).get("brokers", {})
        except orjson.JSONDecodeError:
            return
        if any(b.get("state") == "UP" for b in brokers.values()):
            self._reachable()

    def tick(self) -> None:
        """Log the summaries that are due (the reader calls this after each poll)."""
        if not self._seen:
            return
        now = self._clock()
        with self._lock:
            for key, seen in list(self._seen.items()):
                if now - seen.logged_at >= self.summary_seconds:
                    if seen.count:
                        self._summary(key, seen, now)
                    else:
                        del self._seen[key]  # quiet for a whole interval: news again next time

    # -- internals -------------------------------------------------------------------------------
    def _occurred(self, kind: str, text: str, method: str) -> None:
        broker = broker_of(text)
        now = self._clock()
        with self._lock:
            seen = self._seen.get((kind, broker))
            if seen is None:
                self._seen[(kind, broker)] = _Seen(now, method, text)
                if not self.quiet:
                    getattr(self._log, method)("kafka: " + text, kind=kind, **_named(broker))
                return
            seen.count += 1
            seen.text = text
            if now - seen.logged_at >= self.summary_seconds:
                self._summary((kind, broker), seen, now)

    def _summary(self, key: tuple[str, str | None], seen: _Seen, now: float) -> None:
        if not self.quiet:
            getattr(self._log, seen.method)(
                f"kafka: {key[0]} repeated {seen.count} times in {now - seen.logged_at:.0f} s",
                kind=key[0],
                **_named(key[1]),
                repeats=seen.count,
                last=seen.text,
            )
        seen.logged_at, seen.count = now, 0

    def _reachable(self) -> None:
        since, self.unreachable_since = self.unreachable_since, None
        if since is None:
            return
        with self._lock:
            repeats = {f"{kind} {broker or ''}".strip(): s.count for (kind, broker), s in self._seen.items()}
            self._seen.clear()
        if not self.quiet:
            self._log.info(
                f"kafka: broker reachable again after {self._clock() - since:.1f} s",
                unreachable_seconds=round(self._clock() - since, 3),
                repeats={k: n for k, n in repeats.items() if n},
            )
