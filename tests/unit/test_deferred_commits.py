"""The circuits consumer's commits (toolexec.deferred_commits): at once when a batch
changed something, else deferred but never dropped."""

from __future__ import annotations

from aiokafka import TopicPartition

from tests.waiting import eventually
from toolexec.deferred_commits import DeferredCommits

P0, P1 = TopicPartition("toolexec.invocations", 0), TopicPartition("toolexec.invocations", 1)


class RecordingConsumer:
    """Keeps every commit it is asked for (the consumer's own commit is the broker's)."""

    def __init__(self, fail: bool = False) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self.fail = fail

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.fail:
            raise RuntimeError("partitions revoked")
        self.commits.append(dict(offsets))


async def test_a_batch_that_changed_something_commits_every_position_read_so_far() -> None:
    consumer = RecordingConsumer()
    commits = DeferredCommits(3600, name="test")
    await commits.commit(consumer, {P0: 5}, now=False)
    await commits.commit(consumer, {P0: 7, P1: 2}, now=False)
    assert consumer.commits == []
    await commits.commit(consumer, {P1: 4}, now=True)
    assert consumer.commits == [{P0: 7, P1: 4}]
    await commits.flush()  # nothing left pending
    assert consumer.commits == [{P0: 7, P1: 4}]


async def test_positions_of_batches_that_changed_nothing_are_committed_later() -> None:
    consumer = RecordingConsumer()
    commits = DeferredCommits(0.05, name="test")
    await commits.commit(consumer, {P0: 3}, now=False)
    await commits.commit(consumer, {P0: 9}, now=False)
    await eventually(lambda: consumer.commits, "the deferred commit")
    assert consumer.commits == [{P0: 9}]


async def test_a_commit_refused_after_a_rebalance_is_not_raised() -> None:
    consumer = RecordingConsumer(fail=True)
    commits = DeferredCommits(3600, name="test")
    await commits.commit(consumer, {P0: 3}, now=True)  # logged: the new owner reads again
    assert consumer.commits == []
