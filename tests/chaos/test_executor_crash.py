"""kill -9 of the consumer process in the middle of a burst, then a restart."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos.up_process import start_up, verifier_for, wait_until_up
from tests.log_reading import terminal_event_ids
from tests.waiting import START_WAIT, WAIT
from toolexec.client import InvocationClient
from toolexec.embedded_broker import EmbeddedBroker
from toolexec.stack import TOPIC_PARTITIONS

pytestmark = pytest.mark.chaos

BURST = 300


async def test_kill_9_mid_burst_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    state = tmp_path / "state"
    state.mkdir()
    async with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path) as broker:
        process = start_up(broker.bootstrap, state)
        try:
            await wait_until_up(process, state)
            async with InvocationClient(broker.bootstrap, verifier=verifier_for(state)) as client:
                ids = [str(uuid.uuid4()) for _ in range(BURST)]
                tasks = [asyncio.create_task(client.invoke(
                    "append_id", {"id": i, "ledger": str(ledger)}, invocation_id=i,
                    timeout=3 * START_WAIT)) for i in ids]  # a bound only a hang reaches
                async with asyncio.timeout(START_WAIT):
                    while sum(t.done() for t in tasks) < BURST // 5:
                        await asyncio.sleep(0.05)
                process.send_signal(signal.SIGKILL)
                process.wait()
                process = start_up(broker.bootstrap, state)
                results = await asyncio.gather(*tasks)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=WAIT)
        outcomes = Counter(r.type if r.type == "tool.invoke.completed" else r.data.error.code
                           for r in results)
        assert set(outcomes) <= {"tool.invoke.completed", "E3404"}, outcomes
        assert outcomes["tool.invoke.completed"] >= BURST // 5
        terminals = await terminal_event_ids(broker.bootstrap, set(ids))
        assert {i: len(terminals.get(i, ())) for i in ids} == {i: 1 for i in ids}
    written = ledger.read_text().split()
    assert [i for i, n in Counter(written).items() if n > 1] == []
    completed = {r.data.invocation_id for r in results if r.type == "tool.invoke.completed"}
    assert completed <= set(written)
