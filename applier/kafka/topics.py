"""Which topics one changefeed is read from, and the stream's partition ids (slots) for them.

A TiCDC changefeed with a topic dispatcher (``topic = "{schema}_{table}"`` or per-table rules)
writes one changefeed into many topics: rows to their table's topic, table DDLs to the table's
topic, schema DDLs and resolved events to the default topic (docs/open-protocol.md §5.10). The
daemon reads them all under one barrier, so the setting ``topic`` names a *set*: topic names,
and regular expressions written ``/regex/`` that match whole names (topics created later join
while the daemon runs).

The stream stages (listeners, barrier, windows) key everything by one int per partition. For
one plain topic that int is the Kafka partition number, so nothing changes for the common case.
For several topics, ``TopicSlots`` gives each ``(topic, partition)`` a dense int the first time
it is seen; the checkpoint and every message keep the real topic and partition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


def split_topic_items(text: str) -> list[str]:
    """Items of a comma-separated topic list; an item written ``/regex/`` may hold commas."""
    items: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\n,":
            i += 1
        if i >= n:
            break
        if text[i] == "/":
            end = i + 1
            while True:
                close = text.find("/", end)
                if close < 0:
                    raise ValueError(f"topic pattern {text[i:]!r} has no closing '/'")
                rest = text[close + 1 :].lstrip(" \t")
                if not rest or rest[0] in ",\n":
                    break
                end = close + 1
            items.append(text[i : close + 1])
            i = close + 1
        else:
            end = text.find(",", i)
            end = n if end < 0 else end
            items.append(text[i:end].strip())
            i = end
    return [item for item in items if item]


@dataclass(frozen=True)
class TopicSet:
    """Topic names and ``/regex/`` patterns (a pattern matches a whole topic name)."""

    names: tuple[str, ...]
    patterns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str | Iterable[str]) -> TopicSet:
        """From the setting: a list of items, or one string of comma-separated items."""
        items = (
            split_topic_items(raw) if isinstance(raw, str) else [s for r in raw for s in split_topic_items(r)]
        )
        names: list[str] = []
        patterns: list[str] = []
        for item in items:
            if len(item) >= 2 and item.startswith("/") and item.endswith("/"):
                source = item[1:-1]
                try:
                    re.compile(source)
                except re.error as exc:
                    raise ValueError(f"topic pattern {item!r}: {exc}") from None
                if source not in patterns:
                    patterns.append(source)
            elif item.startswith("/"):
                raise ValueError(f"topic pattern {item!r} has no closing '/'")
            elif item not in names:
                names.append(item)
        if not names and not patterns:
            raise ValueError("expected at least one topic")
        return cls(tuple(sorted(names)), tuple(sorted(patterns)))

    @property
    def single(self) -> str | None:
        """The one plain topic, when the set is just that (the classic one-topic changefeed)."""
        return self.names[0] if len(self.names) == 1 and not self.patterns else None

    def describe(self) -> str:
        """The set as one string: the topic itself for one topic, else the sorted items joined by
        commas. Stored in the checkpoint as the changefeed's topic, and parsed back by ``parse``."""
        return ",".join([*self.names, *(f"/{p}/" for p in self.patterns)])

    def matches(self, topic: str) -> bool:
        return topic in self.names or any(re.fullmatch(p, topic) for p in self.patterns)

    def overlaps(self, other: TopicSet, topics: Iterable[str]) -> bool:
        """Whether some of ``topics`` (those a checkpoint holds offsets for) belong to both sets."""
        return any(self.matches(t) and other.matches(t) for t in topics)


class TopicSlots:
    """The stream's partition id of each ``(topic, partition)``, and back.

    One plain topic: the Kafka partition number itself. Several: a dense int in the order the
    pairs were first seen (only this process uses them; the checkpoint stores real names).
    """

    def __init__(self, topics: TopicSet) -> None:
        self.single = topics.single
        self._slot: dict[tuple[str, int], int] = {}
        self._key: dict[int, tuple[str, int]] = {}

    def slot(self, topic: str, partition: int) -> int:
        if self.single is not None:
            if topic != self.single:
                raise KeyError(topic)
            return partition
        key = (topic, partition)
        found = self._slot.get(key)
        if found is None:
            found = self._slot[key] = len(self._slot)
            self._key[found] = key
        return found

    def key(self, slot: int) -> tuple[str, int]:
        """``(topic, partition)`` of a slot."""
        if self.single is not None:
            return self.single, slot
        return self._key[slot]

    def label(self, slot: int) -> str:
        """How logs and metrics name the partition: its number for one topic, ``topic/partition`` else."""
        if self.single is not None:
            return str(slot)
        topic, partition = self._key[slot]
        return f"{topic}/{partition}"
