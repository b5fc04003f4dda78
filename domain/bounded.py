"""Bounded, most-recently-used-last maps: the memory of caches and de-duplication sets."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(entries: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    """Store `key` as the most recent entry, forgetting the oldest beyond `limit`."""
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > limit:
        entries.popitem(last=False)
