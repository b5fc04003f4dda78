"""The bounded memory shared by caches and de-duplication sets."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given
from hypothesis import strategies as st

from domain.bounded import remember


def test_the_oldest_entry_goes_first_and_a_renewed_one_is_recent() -> None:
    entries: OrderedDict[str, int] = OrderedDict()
    for key in "abc":
        remember(entries, key, ord(key), limit=3)
    remember(entries, "a", 1, limit=3)  # renewed: now the most recent
    remember(entries, "d", 4, limit=3)
    assert list(entries.items()) == [("c", 99), ("a", 1), ("d", 4)]


@given(st.lists(st.integers(0, 20)), st.integers(1, 5))
def test_it_never_holds_more_than_its_limit_and_always_the_latest(keys: list[int],
                                                                   limit: int) -> None:
    entries: OrderedDict[int, None] = OrderedDict()
    for key in keys:
        remember(entries, key, None, limit)
        assert len(entries) <= limit and next(reversed(entries)) == key
