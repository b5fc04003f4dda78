"""The archive of the embedded log: frames, segments, torn tails and damage."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolexec.log_archive import (
    SEGMENT_MAGIC,
    ArchiveCorrupt,
    ArchivedRecord,
    LogArchive,
    PartitionArchive,
    Skip,
    decode_body,
    encode_entry,
)

blobs = st.one_of(st.none(), st.binary(max_size=64))
records = st.builds(
    ArchivedRecord,
    offset=st.integers(min_value=0, max_value=2**62),
    timestamp=st.integers(min_value=-1, max_value=2**62),
    key=blobs, value=blobs,
    headers=st.lists(st.tuples(st.text(max_size=12), blobs), max_size=4).map(tuple),
    timestamp_type=st.sampled_from([0, 1]),
)


def record(offset: int, value: bytes = b"v", **fields: object) -> ArchivedRecord:
    return ArchivedRecord(offset=offset, timestamp=1_700_000_000_000 + offset, key=b"k",
                          value=value, **fields)  # type: ignore[arg-type]


@given(st.one_of(records, st.builds(Skip, st.integers(min_value=0, max_value=2**62))))
def test_every_entry_survives_its_frame(entry: ArchivedRecord | Skip) -> None:
    frame = encode_entry(entry)
    assert decode_body(memoryview(frame)[8:]) == entry


def test_null_and_empty_keys_values_and_headers_stay_apart() -> None:
    entry = ArchivedRecord(3, 9, None, b"", (("a", None), ("b", b"")))
    assert decode_body(memoryview(encode_entry(entry))[8:]) == entry


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=3), blobs), min_size=1,
                max_size=40))
def test_appended_records_read_back_in_order_across_segments_and_reopen(
        tmp_path_factory: pytest.TempPathFactory,
        steps: list[tuple[int, bytes | None]]) -> None:
    directory = tmp_path_factory.mktemp("part")
    archive = PartitionArchive(directory, fsync="never", segment_bytes=200)
    written, offset = [], 0
    for gap, value in steps:
        offset += gap
        entry = ArchivedRecord(offset, offset, None, value)
        archive.append([entry])
        written.append(entry)
        offset += 1
    archive.close()

    reopened = PartitionArchive(directory, fsync="never", segment_bytes=200)
    assert list(reopened.read()) == written
    assert reopened.next_offset == written[-1].offset + 1
    assert reopened.first_offset == written[0].offset
    middle = written[len(written) // 2].offset
    assert list(reopened.read(middle)) == [e for e in written if e.offset >= middle]


def test_a_skip_moves_the_end_and_is_read_back(tmp_path: Path) -> None:
    archive = PartitionArchive(tmp_path, fsync="never")
    archive.append([record(0), record(1), Skip(500)])
    archive.append([record(500)])
    archive.close()

    reopened = PartitionArchive(tmp_path, fsync="never")
    assert list(reopened.read()) == [record(0), record(1), Skip(500), record(500)]
    assert reopened.next_offset == 501


def test_an_offset_below_the_end_is_refused(tmp_path: Path) -> None:
    archive = PartitionArchive(tmp_path, fsync="never")
    archive.append([record(0), record(1)])
    with pytest.raises(ValueError, match="below the archive's end"):
        archive.append([record(1)])


def test_a_write_cut_short_by_a_crash_is_cut_off_at_open(tmp_path: Path) -> None:
    archive = PartitionArchive(tmp_path, fsync="always")
    archive.append([record(n) for n in range(5)])
    archive.close()
    segment = next(tmp_path.glob("*.seg"))
    segment.write_bytes(segment.read_bytes()[:-3])  # the last frame half written

    reopened = PartitionArchive(tmp_path, fsync="always")
    assert [e.offset for e in reopened.read()] == [0, 1, 2, 3]
    assert reopened.next_offset == 4
    reopened.append([record(4, b"again")])
    reopened.close()
    assert list(PartitionArchive(tmp_path).read())[-1] == record(4, b"again")


def test_a_damaged_frame_before_the_end_is_refused_by_name(tmp_path: Path) -> None:
    archive = PartitionArchive(tmp_path, fsync="never")
    archive.append([record(n, b"x" * 20) for n in range(5)])
    archive.close()
    segment = next(tmp_path.glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[len(SEGMENT_MAGIC) + 30] ^= 0xFF  # inside the first frame
    segment.write_bytes(bytes(data))

    with pytest.raises(ArchiveCorrupt, match=segment.name):
        list(PartitionArchive(tmp_path).read())


def test_a_file_that_is_no_segment_is_refused(tmp_path: Path) -> None:
    (tmp_path / f"{0:020d}.seg").write_bytes(b"hello, this is not an archive")
    with pytest.raises(ArchiveCorrupt, match="bad header"):
        PartitionArchive(tmp_path)


def test_topics_groups_and_identity_are_kept(tmp_path: Path) -> None:
    archive = LogArchive(tmp_path, fsync="never")
    assert archive.identity() is None
    archive.create_identity("toolexec-abc", "2026-11-25T00:00:00Z")
    archive.record_topics({"b": 4, "a": 1})
    archive.record_groups({"g": {("a", 0): 3, ("b", 2): 7}})
    archive.partition("a", 0).append([record(0)])
    archive.close()

    again = LogArchive(tmp_path)
    assert again.identity()["cluster_id"] == "toolexec-abc"  # type: ignore[index]
    assert again.topics() == {"a": 1, "b": 4}
    assert again.groups() == {"g": {("a", 0): 3, ("b", 2): 7}}
    assert again.ends()[("a", 0)] == 1
    assert ("b", 3) in again.partitions()


def test_the_last_record_is_known_behind_a_trailing_skip(tmp_path: Path) -> None:
    archive = PartitionArchive(tmp_path, fsync="never", segment_bytes=100)
    archive.append([record(n) for n in range(3)])
    archive.append([Skip(10_000)])
    archive.close()

    reopened = PartitionArchive(tmp_path, fsync="never", segment_bytes=100)
    assert (reopened.first_offset, reopened.last_offset, reopened.next_offset) == (0, 2, 10_000)


def test_an_archive_whose_root_was_deleted_is_not_made_again(tmp_path: Path) -> None:
    root = tmp_path / "state" / "log"
    archive = LogArchive(root, fsync="never")
    archive.partition("a", 0).append([record(0)])
    shutil.rmtree(tmp_path / "state")  # the state directory deleted under the broker

    with pytest.raises(FileNotFoundError):
        archive.partition("b", 0)  # a partition seen for the first time
    assert not (tmp_path / "state").exists()
