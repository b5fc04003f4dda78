"""Broker restart in the middle of a burst: reconnect, finish what can be finished,
report the rest.

The broker is Tansu on `s3://` storage kept by a small object store outside it
(tests/s3_store.py), so a restart keeps the log, the committed offsets and the
consumer groups, as a production Kafka restart would. The consumers run in their own
`toolexec up` process and the producer is an `InvocationClient`, like the kill -9 test.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from domain.errors import ToolexecError
from tests.chaos.up_process import start_up, verifier_for, wait_until_up
from tests.log_reading import terminal_event_ids
from tests.s3_store import s3_store, tansu_s3_env
from tests.waiting import START_WAIT, WAIT
from toolexec.client import InvocationClient
from toolexec.embedded_broker import EmbeddedBroker
from toolexec.stack import TOPIC_PARTITIONS

pytestmark = pytest.mark.chaos


BURST = 150
AFTER_RESTART = 20
DURING_OUTAGE = 10
TIMEOUT = 90.0
OUTAGE_TIMEOUT = 2.0  # shorter than the outage: these callers must be told
DOWNTIME = 6.0
FETCH_WAIT_MS = 100
REPORTED_CODES = {"E3001", "E3002"}


def outcome(result: object) -> str:
    """What the caller saw: completed, the failure's code, or the code it was told."""
    if isinstance(result, ToolexecError):
        return f"reported {result.code}"
    if isinstance(result, BaseException):
        return f"raised {result!r}"
    return result.type if result.type == "tool.invoke.completed" else result.data.error.code


async def test_broker_restart_mid_burst_finishes_or_reports_every_invocation(
        tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    state = tmp_path / "state"
    state.mkdir()
    with s3_store() as (endpoint, _):
        broker = EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path, storage_engine="s3://toolexec/",
                                env=tansu_s3_env(endpoint))
        async with broker:
            process = start_up(broker.bootstrap, state, log=(state / "up.log").open("ab"))
            try:
                await wait_until_up(process, state)
                # Tansu's s3 fetch answers empty when its object reads outlast the
                # fetch wait, so the client waits longer than its 1 ms default.
                async with InvocationClient(broker.bootstrap,
                                            fetch_waits=(FETCH_WAIT_MS, FETCH_WAIT_MS),
                                            verifier=verifier_for(state)) as client:
                    def invoke(invocation_id: str, timeout: float = TIMEOUT) -> asyncio.Task:
                        return asyncio.create_task(client.invoke(
                            "append_id", {"id": invocation_id, "ledger": str(ledger)},
                            invocation_id=invocation_id, timeout=timeout))

                    def new_ids(count: int) -> list[str]:
                        return [str(uuid.uuid4()) for _ in range(count)]

                    burst = {i: invoke(i) for i in new_ids(BURST)}
                    async with asyncio.timeout(START_WAIT):
                        while sum(t.done() for t in burst.values()) < BURST // 5:
                            await asyncio.sleep(0.05)
                    before_restart = {i for i, t in burst.items() if t.done()}
                    restart = asyncio.create_task(broker.restart(downtime=DOWNTIME))
                    async with asyncio.timeout(WAIT):
                        while broker.running:
                            await asyncio.sleep(0.05)
                    during = {i: invoke(i, OUTAGE_TIMEOUT) for i in new_ids(DURING_OUTAGE)}
                    await restart
                    later = {i: invoke(i) for i in new_ids(AFTER_RESTART)}
                    tasks = {**burst, **during, **later}
                    results = dict(zip(tasks, await asyncio.gather(
                        *tasks.values(), return_exceptions=True), strict=True))
                terminals = await terminal_event_ids(broker.bootstrap, set(results))
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=WAIT)

    outcomes = Counter(outcome(r) for r in results.values())
    assert not [o for o in outcomes if o.startswith("raised")], outcomes
    # Every invocation ended in the log or was reported to its caller with a code
    # (E3001 not delivered, E3002 no result in time); none ended twice.
    reported = {i for i, r in results.items() if isinstance(r, ToolexecError)}
    assert {results[i].code for i in reported} <= REPORTED_CODES, outcomes
    assert {i: len(terminals.get(i, ())) for i in results if i not in reported} == \
        {i: 1 for i in results if i not in reported}, outcomes
    assert all(len(terminals.get(i, ())) <= 1 for i in reported), outcomes
    # Callers that gave up while the broker was away were told so.
    assert {outcome(results[i]) for i in during} == {"reported E3001"}, outcomes
    # The system reconnected: what was requested after the restart completed, and
    # so did the part of the burst that was in flight across it.
    assert {outcome(results[i]) for i in later} == {"tool.invoke.completed"}, outcomes
    assert [i for i in burst if i not in before_restart
            and outcome(results[i]) == "tool.invoke.completed"], outcomes
    # The non-idempotent tool ran at most once per invocation.
    written = ledger.read_text().split()
    assert [i for i, n in Counter(written).items() if n > 1] == []
    completed = {i for i, r in results.items() if outcome(r) == "tool.invoke.completed"}
    assert completed <= set(written)
