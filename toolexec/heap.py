"""Garbage collection tuned for a long-running toolexec process (`up`, the bench's stack).

CPython's cyclic collector, left at its defaults, took 17 % of the stack's CPU under
the bench's API load (measured with gc callbacks timing each collection's thread CPU):
every full collection walked the ~190,000 objects that imports and startup made
(110 ms of CPU each), and young collections ran every 700 allocations. Once started,
those objects live as long as the process: `settle` moves them out of the collector's
sight (`gc.freeze`) and collects young objects every YOUNG_THRESHOLD allocations
instead (most die of their reference count long before; what cycles remain are
collected all the same, later). Measured: GC 2.3 s -> 1.0 s of CPU in a throughput
run, full collections 110 ms -> 28-67 ms each. The projection rebuild does the same
for its own duration (projections.rebuild_workers).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def settle() -> None:
    """Call once a long-running process has started: collect what startup left, freeze
    the survivors, collect young objects rarely."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
