"""Which worker of a parallel rebuild reads which partitions (pure).

Partitions are independent for every read model but one kind: an aggregate read model
that reads several topics (invocations: requests and facts) needs all of an
aggregate's events, and those share a partition *index* across its topics (an
invocation's facts go to the partition of its request). Such partitions form one
unit; every other partition is a unit of its own (an audit chain is per partition).
Units go to the least loaded worker, largest first, so the workers' shares of the
log are as even as whole units allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

Place = tuple[str, int]
"""(topic, partition)."""


def rebuild_units(sizes: Mapping[Place, int],
                  co_partitioned: Iterable[Sequence[str]] = ()) -> list[list[Place]]:
    """Group `sizes`' partitions into units that one worker must read together.

    `co_partitioned` lists topic groups whose partitions of one index hold the same
    aggregates; groups sharing a topic are merged. Units come out sorted."""
    groups: list[set[str]] = []
    for topics in co_partitioned:
        merged = set(topics)
        for group in [g for g in groups if g & merged]:
            merged |= group
            groups.remove(group)
        if len(merged) > 1:
            groups.append(merged)
    group_of = {topic: min(group) for group in groups for topic in group}
    units: dict[tuple[str, int], list[Place]] = {}
    for topic, partition in sorted(sizes):
        key = (group_of.get(topic, topic), partition)
        units.setdefault(key, []).append((topic, partition))
    return [units[key] for key in sorted(units)]


def assign_units(units: Sequence[Sequence[Place]], sizes: Mapping[Place, int],
                 workers: int) -> list[list[Place]]:
    """Spread `units` over at most `workers` workers, largest unit first onto the least
    loaded worker (ties: the lower worker index); empty units are left out and so are
    workers with nothing to read. Deterministic for the same input."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    weighted = sorted(((sum(sizes.get(p, 0) for p in unit), sorted(unit)) for unit in units),
                      key=lambda item: (-item[0], item[1]))
    shares: list[list[Place]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for weight, unit in weighted:
        if weight <= 0:
            continue
        target = min(range(workers), key=lambda i: (loads[i], i))
        shares[target].extend(unit)
        loads[target] += weight
    return [sorted(share) for share in shares if share]
