"""`heap.settle`: what startup made is left out of collections, young objects are
collected rarely, and garbage cycles made afterwards are still collected."""

from __future__ import annotations

import gc
import weakref

from toolexec import heap


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_settle_freezes_what_startup_made_and_still_collects_later_cycles() -> None:
    thresholds = gc.get_threshold()
    try:
        heap.settle()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, *thresholds[1:])
        first, second = _Node(), _Node()
        first.peer, second.peer = second, first
        gone = weakref.ref(first)
        del first, second
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
