"""How archived records are grouped into the record batches a restore produces."""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import given
from hypothesis import strategies as st

from toolexec.log_archive import ArchivedRecord, Skip
from toolexec.log_restore import PlannedBatch, encode_batch, plan_batches, retention_starts


def record(offset: int, size: int = 10) -> ArchivedRecord:
    return ArchivedRecord(offset, 1_000 + offset, b"k", b"x" * size, (("h", b"1"),))


@st.composite
def partitions(draw: st.DrawFn) -> tuple[list[ArchivedRecord | Skip], int]:
    """Archived entries of one partition (offsets rising, gaps anywhere) and the skip
    after the last record, if any (0 for none)."""
    entries: list[ArchivedRecord | Skip] = []
    offset = draw(st.integers(min_value=0, max_value=50))
    for _ in range(draw(st.integers(min_value=1, max_value=60))):
        offset += draw(st.sampled_from([0, 0, 0, 1, 7]))
        entries.append(record(offset, draw(st.integers(min_value=0, max_value=300))))
        offset += 1
    trailing = 0
    if draw(st.booleans()):
        trailing = offset + draw(st.integers(min_value=0, max_value=1000))
        entries.append(Skip(trailing))
    return entries, trailing


@given(partitions(), st.integers(min_value=1, max_value=20), st.integers(min_value=50,
                                                                         max_value=2000))
def test_batches_put_every_record_in_order_at_the_offsets_the_broker_will_give(
        partition: tuple[list[ArchivedRecord | Skip], int], max_records: int,
        max_bytes: int) -> None:
    entries, trailing = partition
    wanted = [e for e in entries if isinstance(e, ArchivedRecord)]
    batches = list(plan_batches(entries, max_records=max_records, max_bytes=max_bytes))

    assert [r for b in batches for r in b.records] == wanted
    end = 0
    for batch in batches:
        assert batch.base == end  # each batch starts where the broker's log ends
        assert batch.base <= batch.records[0].offset
        assert batch.records[-1].offset < batch.end
        assert len(batch.records) <= max_records
        end = batch.end
    assert end == max(wanted[-1].offset + 1, trailing)
    assert batches[-1].records == (wanted[-1],)  # ListOffsets(latest) stays right


def test_a_gap_before_a_record_is_its_offset_delta_and_a_final_skip_is_claimed() -> None:
    batch = PlannedBatch(base=10, records=(record(12), record(13)), end=100)
    decoded = DefaultRecordBatch(bytearray(encode_batch(batch)))

    assert decoded.validate_crc()
    assert decoded.last_offset_delta == 89  # offsets 10..99 belong to this batch
    assert [(r.offset, r.value, r.timestamp) for r in decoded] == [
        (2, b"x" * 10, 1012), (3, b"x" * 10, 1013)]  # deltas from the base


def test_retention_keeps_the_last_records_of_trimmed_topics_only() -> None:
    partitions = {("toolexec.invocations", 0): (0, 1000), ("toolexec.invocations", 1): (0, 50),
                  ("toolexec.registry", 0): (0, 5000), ("toolexec.invocations", 2): (None, 0)}
    starts = retention_starts(partitions, trim_topics=["toolexec.invocations"], retain=100)
    assert starts == {("toolexec.invocations", 0): 900}


def test_retention_never_leaves_out_what_a_group_has_not_consumed() -> None:
    partitions = {("t", 0): (0, 1000)}
    pinned = retention_starts(partitions, trim_topics=["t"], retain=100,
                              pinned={("t", 0): 400})
    assert pinned == {("t", 0): 400}
    assert retention_starts(partitions, trim_topics=["t"], retain=0) == {}
    assert retention_starts({("t", 0): (950, 1000)}, trim_topics=["t"], retain=100) == {}
