"""Helpers for the operations tests: HTTP probes, Prometheus scrapes, waiting on a running daemon."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import read_log

T = TypeVar("T")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; 4xx/5xx are answers, not exceptions."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(base: str) -> Samples:
    """Every sample of ``/metrics`` keyed by (name, sorted labels)."""
    status, body = http_get(base + "/metrics")
    assert status == 200, body
    out: Samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def wait_until(check: Callable[[], T], timeout: float, what: str, proc: subprocess.Popen | None = None) -> T:
    """Poll ``check`` until it returns something truthy; fail with the daemon's log otherwise."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, AssertionError) as exc:  # not listening yet, or a scrape in between
            last = exc
        else:
            if last:
                return last  # type: ignore[return-value]
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    log = read_log(proc) if proc is not None else ""
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})\n{log[-4000:]}")


_ADDRESS = re.compile(r'"address": "([^"]+)"')


def http_base(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """``http://HOST:PORT`` the daemon logged for its endpoints (it runs with --log-format json)."""

    def find() -> str | None:
        for line in read_log(proc).splitlines():
            if "http endpoints listening" in line:
                return "http://" + json.loads(line)["address"]
        return None

    return wait_until(find, timeout, "the http endpoints", proc)


def scrape_when(base: str, predicate: Callable[[Samples], bool]) -> Samples | None:
    """One scrape, returned only when ``predicate`` holds (for :func:`wait_until`)."""
    samples = scrape(base)
    return samples if predicate(samples) else None
