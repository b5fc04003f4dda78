"""How a parallel rebuild shares partitions among its workers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from projections.rebuild_plan import assign_units, rebuild_units

REQ, FACTS, REG = "toolexec.requests", "toolexec.invocations", "toolexec.registry"


def _sizes(partitions: int, records: int = 10) -> dict[tuple[str, int], int]:
    sizes = {(REQ, p): records for p in range(partitions)}
    sizes.update({(FACTS, p): 5 * records for p in range(partitions)})
    sizes[(REG, 0)] = 3
    return sizes


def test_requests_and_facts_of_one_partition_index_are_one_unit() -> None:
    units = rebuild_units(_sizes(4), [(REQ, FACTS)])
    assert [(FACTS, 2), (REQ, 2)] in [sorted(u) for u in units]
    assert [(REG, 0)] in units
    assert len(units) == 5


def test_without_co_partitioned_topics_every_partition_is_a_unit() -> None:
    assert len(rebuild_units(_sizes(4))) == 9


def test_topic_groups_sharing_a_topic_are_merged() -> None:
    units = rebuild_units({("a", 0): 1, ("b", 0): 1, ("c", 0): 1, ("d", 0): 1},
                          [("a", "b"), ("b", "c")])
    assert sorted(map(sorted, units)) == [[("a", 0), ("b", 0), ("c", 0)], [("d", 0)]]


def test_units_go_to_the_least_loaded_worker_largest_first() -> None:
    sizes = _sizes(4)
    shares = assign_units(rebuild_units(sizes, [(REQ, FACTS)]), sizes, 2)
    loads = [sum(sizes[p] for p in share) for share in shares]
    assert len(shares) == 2 and max(loads) - min(loads) <= 3
    assert sorted(p for share in shares for p in share) == sorted(sizes)


def test_empty_partitions_and_idle_workers_are_left_out() -> None:
    sizes = {(REG, 0): 4, (FACTS, 0): 0, (FACTS, 1): 0}
    assert assign_units(rebuild_units(sizes), sizes, 8) == [[(REG, 0)]]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 6),
       st.lists(st.integers(0, 1000), min_size=1, max_size=12))
def test_every_record_is_read_by_exactly_one_worker_and_pairs_stay_together(
        partitions: int, workers: int, counts: list[int]) -> None:
    sizes = {(FACTS, p): counts[p % len(counts)] for p in range(partitions)}
    sizes.update({(REQ, p): counts[(p + 1) % len(counts)] for p in range(partitions)})
    shares = assign_units(rebuild_units(sizes, [(REQ, FACTS)]), sizes, workers)
    read = [p for share in shares for p in share]
    assert len(read) == len(set(read))
    assert set(read) == {p for p, n in sizes.items() if n > 0 or sizes.get(
        (REQ if p[0] == FACTS else FACTS, p[1]), 0) > 0}
    for share in shares:
        indexes = {p for _, p in share}
        assert all(((REQ, i) in share) == ((FACTS, i) in share) for i in indexes)
    assert len(shares) <= workers
    assert shares == assign_units(rebuild_units(sizes, [(REQ, FACTS)]), sizes, workers)
