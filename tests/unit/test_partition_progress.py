"""Where a new owner of a requests partition resumes: the promises of `toolexec-resume`.

Whatever order requests are read, handed over, run and finished in, the header
(L, F) written with any fact says: every request below L is finished, and every
fact of a request at or above L is at or above F. A property test drives random
schedules of a partition and checks both after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.runtime.partition_progress import PartitionProgress, ResumePoint


def test_a_request_handed_over_locally_is_not_run_again_when_the_consumer_reads_it() -> None:
    progress = PartitionProgress(0, next_read=10, high_water=100)
    progress.hand_over(12)
    assert progress.take(10) is True
    assert progress.take(11) is True
    assert progress.take(12) is False  # the local run has it


def test_requests_below_the_resume_point_are_known_finished() -> None:
    progress = PartitionProgress(0, next_read=5, high_water=40, resume_below=8)
    assert [progress.take(o) for o in (5, 6, 7, 8)] == [False, False, False, True]


def test_the_commit_position_waits_for_the_oldest_unfinished_request() -> None:
    progress = PartitionProgress(0, next_read=0, high_water=0)
    for offset in range(3):
        progress.take(offset)
    progress.finish(1)
    progress.finish(2)
    assert progress.low_water == 0
    progress.finish(0)
    assert progress.low_water == 3


def test_the_facts_floor_is_where_the_oldest_unfinished_request_began() -> None:
    progress = PartitionProgress(0, next_read=0, high_water=50)
    progress.take(0)
    progress.acknowledged(60)
    progress.take(1)
    assert progress.facts_floor == 50
    progress.finish(0)
    assert progress.facts_floor == 61
    assert progress.resume_header() == b"1 61"


def test_a_resume_header_is_two_offsets_or_nothing() -> None:
    assert ResumePoint.parse(b"12 340") == ResumePoint(12, 340)
    for bad in (b"", b"12", b"a b", b"-1 4", b"1 2 3", b"\xff"):
        assert ResumePoint.parse(bad) is None


@dataclass
class Partition:
    """A model of one partition's requests and the facts the pipeline appends."""

    progress: PartitionProgress = field(
        default_factory=lambda: PartitionProgress(0, next_read=0, high_water=0))
    cursor: int = 0
    handed: set[int] = field(default_factory=set)
    begun: dict[int, bool] = field(default_factory=dict)
    facts: list[tuple[int, int]] = field(default_factory=list)
    log_end: int = 0
    committed: int = 0

    def step(self, op: str, pick: int) -> None:
        unfinished = sorted(o for o, done in self.begun.items() if not done)
        if op == "read":
            if self.progress.take(self.cursor):
                self.begun[self.cursor] = False
            elif self.cursor not in self.handed:
                raise AssertionError(f"offset {self.cursor} taken for known")
            self.cursor += 1
        elif op == "skip":
            if self.cursor not in self.handed:  # a cancel, or a bad record
                self.progress.skip(self.cursor)
                self.cursor += 1
        elif op == "hand_over":
            offset = self.cursor + pick % 4
            if offset not in self.handed and offset not in self.begun:
                self.progress.hand_over(offset)
                self.handed.add(offset)
                self.begun[offset] = False
        elif op == "fact" and unfinished:
            request = unfinished[pick % len(unfinished)]
            header = ResumePoint.parse(self.progress.resume_header())
            assert header is not None
            self.check(header)
            self.facts.append((request, self.log_end))
            self.progress.acknowledged(self.log_end)
            self.log_end += 1
        elif op == "finish" and unfinished:
            request = unfinished[pick % len(unfinished)]
            self.begun[request] = True
            self.progress.finish(request)
        low = self.progress.low_water
        assert low >= self.committed, "the commit position never goes back"
        self.committed = low

    def check(self, header: ResumePoint) -> None:
        for request, done in self.begun.items():
            if request < header.low_water:
                assert done and request < self.cursor, (request, header)
        for request, offset in self.facts:
            if request >= header.low_water:
                assert offset >= header.facts_floor, (request, offset, header)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["read", "skip", "hand_over", "fact", "finish"]),
                          st.integers(0, 50)), max_size=120))
def test_any_schedule_keeps_the_resume_promises(schedule: list[tuple[str, int]]) -> None:
    partition = Partition()
    for op, pick in schedule:
        partition.step(op, pick)
        header = ResumePoint.parse(partition.progress.resume_header())
        assert header is not None
        partition.check(header)
