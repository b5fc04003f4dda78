"""Which requests of one partition are finished, and where a new owner would resume.

The pipeline runs many requests of a partition at once and finishes them out of
order; some are handed over in memory by a local producer before the consumer reads
them. `PartitionProgress` keeps, per request offset, whether its run finished and the
*floor* of its facts: the offset of the invocations partition below which none of its
facts can be (the end of that partition as known when the run began — every fact this
process produces after that lands above it).

Two numbers follow, and they are all a restart needs:

- `low_water` (L): every request below it is finished. It is the commit position.
- `facts_floor` (F): every fact of a request at or above L is at or above F.

Each fact the pipeline appends carries both (the `toolexec-resume` record header,
consumers.runtime.fact_log). A new owner reads the last such header of the partition, skips
the requests below L and reads the facts from F to the end to resume the others
(consumers.runtime.recovery) — whatever the committed offset says, and without the offset
commit metadata that some brokers (Tansu) drop.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Request:
    floor: int
    finished: bool = False


class PartitionProgress:
    """Progress of one requests partition; `next_read` is the consumer's position,
    `high_water` the end of the matching invocations partition as far as known."""

    def __init__(self, partition: int, *, next_read: int, high_water: int,
                 resume_below: int = 0) -> None:
        self.partition = partition
        self.next_read = next_read
        self.high_water = high_water
        self.resume_below = resume_below
        """Requests below this offset were finished before this process owned the
        partition (read from the log at assignment); they are skipped."""
        self.owned = True
        """False once the partition was revoked: its facts then carry no header."""
        self.last_signed_batch: str | None = None
        """`chain_link` of the fact batch signed last for this partition, which the
        next one links to (contracts.fact_signature: chained batches)."""
        self._requests: dict[int, _Request] = {}

    # -- requests ---------------------------------------------------------------------

    def take(self, offset: int) -> bool:
        """The consumer read the request at `offset`: True when it is new here (then it
        counts as begun), False when it is known already (finished before this process
        owned the partition, or handed over locally): not to run again."""
        new = not (offset < self.resume_below or offset < self.low_water
                   or offset in self._requests)
        if new:
            self._requests[offset] = _Request(self.high_water)
        self.skip(offset)
        return new

    def skip(self, offset: int) -> None:
        """The consumer read a record at `offset` with nothing to run (a cancel, a bad
        record, another request of an invocation running here)."""
        if offset >= self.next_read:
            self.next_read = offset + 1
            self._prune()

    def hand_over(self, offset: int) -> None:
        """A local producer hands the request at `offset` over before the consumer may
        have read it; it counts as begun."""
        if not (offset < self.low_water or offset in self._requests):
            self._requests[offset] = _Request(self.high_water)

    def finish(self, offset: int) -> None:
        """The request at `offset` is finished (its terminal event is on the log)."""
        request = self._requests.get(offset)
        if request is not None:
            request.finished = True
            self._prune()

    def acknowledged(self, offset: int) -> None:
        """A fact of this partition was acknowledged at `offset` of the invocations
        partition: later facts land above it."""
        if offset >= self.high_water:
            self.high_water = offset + 1

    # -- where a restart resumes ------------------------------------------------------

    @property
    def low_water(self) -> int:
        """L: every request below it is finished (the commit position)."""
        unfinished = [o for o, r in self._requests.items() if not r.finished]
        return min(min(unfinished, default=self.next_read), self.next_read)

    @property
    def facts_floor(self) -> int:
        """F: every fact of a request at or above L is at or above it."""
        return min((r.floor for r in self._requests.values()), default=self.high_water)

    def resume_header(self) -> bytes:
        """`L F` as the `toolexec-resume` header value."""
        return f"{self.low_water} {self.facts_floor}".encode("ascii")

    def _prune(self) -> None:
        below = self.low_water
        for offset in [o for o in self._requests if o < below]:
            del self._requests[offset]


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """What a `toolexec-resume` header says: requests below `low_water` are finished;
    facts of the others are at or above `facts_floor`."""

    low_water: int
    facts_floor: int

    @classmethod
    def parse(cls, value: bytes) -> ResumePoint | None:
        """The header's value, or None when it is not two non-negative integers."""
        try:
            low, floor = value.decode("ascii").split(" ")
            point = cls(int(low), int(floor))
        except (UnicodeDecodeError, ValueError):
            return None
        return point if point.low_water >= 0 and point.facts_floor >= 0 else None
