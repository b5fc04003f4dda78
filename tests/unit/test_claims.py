from __future__ import annotations

from pathlib import Path

import pytest

from consumers.adapters.claim_store import InMemoryClaims, RedisClaims, SqliteClaims
from domain.claims import LEASE_GRACE_SECONDS, ClaimRecord, ClaimStatus, decide

STORES = ["memory", "sqlite", "redis"]


@pytest.fixture
async def store_factory(request: pytest.FixtureRequest, tmp_path: Path):
    """Stores of one kind that share their rows: factory(owner) -> ClaimStore."""
    kind = request.param
    rows: dict[str, ClaimRecord] = {}
    opened = []

    def make(owner: str):
        if kind == "memory":
            return InMemoryClaims(owner, rows)
        if kind == "sqlite":
            return SqliteClaims(tmp_path / "claims.sqlite3", owner=owner)
        import redis.asyncio

        url = request.getfixturevalue("redis_url")
        client = redis.asyncio.Redis.from_url(url)
        opened.append(client)
        return RedisClaims(client, owner, prefix=f"test:{tmp_path.name}:")
    yield make
    for client in opened:
        await client.aclose()


def test_first_delivery_acquires_the_claim() -> None:
    decision = decide(None, key="i/1", owner="a", now=100.0, lease_seconds=10)
    assert decision.status is ClaimStatus.ACQUIRED
    assert decision.record == ClaimRecord("i/1", "a", 110.0 + LEASE_GRACE_SECONDS, False)


def test_finished_claim_means_nothing_to_do() -> None:
    row = ClaimRecord("i/1", "a", 0.0, True)
    assert decide(row, key="i/1", owner="b", now=1e9, lease_seconds=1).status \
        is ClaimStatus.FINISHED


def test_same_owner_finds_the_claim_it_left_unfinished() -> None:
    row = ClaimRecord("i/1", "a", 200.0, False)
    assert decide(row, key="i/1", owner="a", now=150, lease_seconds=1).status \
        is ClaimStatus.RUNNING_HERE


def test_live_lease_of_another_owner_is_waited_out_then_abandoned() -> None:
    row = ClaimRecord("i/1", "a", 200.0, False)
    assert decide(row, key="i/1", owner="b", now=199, lease_seconds=1).status \
        is ClaimStatus.HELD_ELSEWHERE
    assert decide(row, key="i/1", owner="b", now=200, lease_seconds=1).status \
        is ClaimStatus.ABANDONED


@pytest.mark.parametrize("store_factory", STORES, indirect=True)
async def test_stores_apply_the_decision_atomically(store_factory) -> None:
    first = store_factory("a")
    assert (await first.claim("i/1", now=0, lease_seconds=1)).status is ClaimStatus.ACQUIRED
    assert (await first.claim("i/1", now=0, lease_seconds=1)).status is ClaimStatus.RUNNING_HERE
    assert (await store_factory("b").claim("i/1", now=0, lease_seconds=1)).status \
        is ClaimStatus.HELD_ELSEWHERE
    await first.finish("i/1")
    assert (await first.claim("i/1", now=0, lease_seconds=1)).status is ClaimStatus.FINISHED


@pytest.mark.parametrize("store_factory", STORES, indirect=True)
async def test_only_one_executor_takes_over_an_abandoned_claim(store_factory) -> None:
    await store_factory("dead").claim("i/1", now=0, lease_seconds=1)
    late = 1 + LEASE_GRACE_SECONDS + 1
    b, c = store_factory("b"), store_factory("c")
    seen_b = await b.claim("i/1", now=late, lease_seconds=1)
    seen_c = await c.claim("i/1", now=late, lease_seconds=1)
    assert seen_b.status is seen_c.status is ClaimStatus.ABANDONED
    assert await b.take_over(seen_b.record, now=late, lease_seconds=1) is True
    assert await c.take_over(seen_c.record, now=late, lease_seconds=1) is False
    assert (await b.claim("i/1", now=late, lease_seconds=1)).status is ClaimStatus.RUNNING_HERE
    assert (await c.claim("i/1", now=late, lease_seconds=1)).status is ClaimStatus.HELD_ELSEWHERE


async def test_sqlite_claims_survive_a_restart_and_a_gone_owner_is_not_waited_out(
        tmp_path: Path) -> None:
    before = SqliteClaims(tmp_path / "claims.sqlite3", owner="old")
    await before.claim("i/1", now=0, lease_seconds=100)
    before.close()  # its owner is gone: its lease (until 105) is not waited out
    after = SqliteClaims(tmp_path / "claims.sqlite3", owner="new")
    abandoned = await after.claim("i/1", now=1, lease_seconds=1)
    assert abandoned.status is ClaimStatus.ABANDONED
    assert await after.take_over(abandoned.record, now=1, lease_seconds=1)
    assert (await after.claim("i/1", now=1, lease_seconds=1)).status is ClaimStatus.RUNNING_HERE


def test_a_claim_whose_owner_held_no_lock_expires_with_its_lease(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "claims.sqlite3"
    SqliteClaims(path, owner="new").close()
    with sqlite3.connect(path) as db:  # as a store written before owners held a lock
        db.execute("INSERT INTO claims (key, owner, lease_until, finished, started) "
                   "VALUES ('i/1', 'old', ?, 0, 1)", (1 + LEASE_GRACE_SECONDS,))
    after = SqliteClaims(path, owner="new")
    assert after._claim("i/1", 1, 1).status is ClaimStatus.HELD_ELSEWHERE
    assert after._claim("i/1", 1 + LEASE_GRACE_SECONDS, 1).status is ClaimStatus.ABANDONED


_HOLDER = """
import asyncio, sys
from pathlib import Path
from consumers.adapters.claim_store import SqliteClaims
store = SqliteClaims(Path(sys.argv[1]), owner="killed")
asyncio.run(store.claim("i/1", now=0, lease_seconds=3600))
print("claimed", flush=True)
sys.stdin.read()
"""


def test_the_claim_of_an_executor_killed_with_sigkill_is_abandoned_at_once(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "claims.sqlite3"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "claimed\n"
        store = SqliteClaims(path, owner="next")
        assert store._claim("i/1", 1, 1).status is ClaimStatus.HELD_ELSEWHERE  # alive
        holder.kill()
        holder.wait()
        assert store._claim("i/1", 1, 1).status is ClaimStatus.ABANDONED  # lease or not
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_files_of_gone_owners_go_unless_they_left_claims(tmp_path: Path) -> None:
    path, owners = tmp_path / "claims.sqlite3", tmp_path / "claims.sqlite3.owners"
    left = SqliteClaims(path, owner="left")
    left._claim("i/1", 0, 100)
    left.close()
    SqliteClaims(path, owner="done").close()
    assert len(list(owners.iterdir())) == 2
    live = SqliteClaims(path, owner="live")
    assert len(list(owners.iterdir())) == 2  # "left"'s (an unfinished claim) and "live"'s
    assert live._owners.gone("left") and not live._owners.gone("live")
    assert not live._owners.gone("done")  # no file: taken as alive (no claim to judge)


@pytest.mark.parametrize("store_factory", STORES, indirect=True)
async def test_finished_claim_keeps_its_conclusion_across_restarts(store_factory) -> None:
    before = store_factory("old")
    await before.claim("i/1", now=0, lease_seconds=1)
    await before.finish("i/1", b'{"the": "event"}')
    found = await store_factory("new").claim("i/1", now=1e9, lease_seconds=1)
    assert found.status is ClaimStatus.FINISHED
    assert found.record is not None and found.record.conclusion == b'{"the": "event"}'


def test_a_store_written_before_conclusions_were_kept_is_upgraded(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "claims.sqlite3"
    with sqlite3.connect(path) as old:
        old.execute("CREATE TABLE claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                    "lease_until REAL NOT NULL, finished INTEGER NOT NULL DEFAULT 0)")
        old.execute("INSERT INTO claims VALUES ('i/1', 'a', 0, 1)")
    store = SqliteClaims(path, owner="b")
    assert store._claim("i/1", 1.0, 1.0).record.conclusion is None


@pytest.mark.parametrize("store_factory", STORES, indirect=True)
async def test_an_executor_whose_claim_was_taken_over_cannot_conclude_it(store_factory) -> None:
    stalled = store_factory("stalled")
    await stalled.claim("i/1", now=0, lease_seconds=1)
    late = 1 + LEASE_GRACE_SECONDS + 1
    other = store_factory("other")
    seen = await other.claim("i/1", now=late, lease_seconds=1)
    assert await other.take_over(seen.record, now=late, lease_seconds=1)
    assert await stalled.finish("i/1", b'{"late": true}') is False
    assert await other.finish("i/1", b'{"unknown": true}') is True
    found = await store_factory("reader").claim("i/1", now=late, lease_seconds=1)
    assert found.record is not None and found.record.conclusion == b'{"unknown": true}'


@pytest.mark.parametrize("store_factory", STORES, indirect=True)
async def test_an_executor_whose_claim_was_taken_over_cannot_start_it(store_factory) -> None:
    stalled = store_factory("stalled")
    await stalled.claim("i/1", now=0, lease_seconds=1)
    late = 1 + LEASE_GRACE_SECONDS + 1
    other = store_factory("other")
    seen = await other.claim("i/1", now=late, lease_seconds=1)
    assert seen.record is not None and seen.record.started is False  # it never started
    assert await other.take_over(seen.record, now=late, lease_seconds=1)
    assert await stalled.start("i/1") is False


@pytest.mark.parametrize("store_factory", STORES, indirect=True)
async def test_a_started_claim_says_so_to_the_executor_that_finds_it_abandoned(
        store_factory) -> None:
    dead = store_factory("dead")
    await dead.claim("i/1", now=0, lease_seconds=1)
    assert await dead.start("i/1") is True
    found = await store_factory("next").claim("i/1", now=1 + LEASE_GRACE_SECONDS + 1,
                                             lease_seconds=1)
    assert found.status is ClaimStatus.ABANDONED
    assert found.record is not None and found.record.started is True


def test_unfinished_claims_of_a_store_written_before_starts_were_marked_count_as_started(
        tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "claims.sqlite3"
    with sqlite3.connect(path) as old:
        old.execute("CREATE TABLE claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                    "lease_until REAL NOT NULL, finished INTEGER NOT NULL DEFAULT 0, "
                    "conclusion BLOB)")
        old.execute("INSERT INTO claims VALUES ('i/1', 'a', 0, 0, NULL)")
    store = SqliteClaims(path, owner="b")
    assert store._claim("i/1", 1e9, 1.0).record.started is True
    assert store._claim("i/2", 1e9, 1.0).record.started is False  # a new claim
