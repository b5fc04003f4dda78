"""kill -9 of `up` while a resumable 20-step tool runs, then a restart: the new owner
resumes the invocation from its last checkpoint, and every step is done once.

The tool appends each step to a ledger outside its run directory, then checkpoints
and reports progress; on a fresh start it holds after step HOLD until the executor
that started it is gone (under the rlimits sandbox of these tests a tool outlives a
killed executor; bubblewrap's would die with it), so the kill falls between two
steps: the work of a step after its last checkpoint is, by the protocol, done again.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from domain.canonical_json import canonical_json
from domain.checkpoints import state_hash
from tests.chaos.up_process import start_up, verifier_for, wait_until_up
from tests.cli_process import toolexec
from tests.log_reading import invocation_events, terminal_event_ids
from tests.waiting import WAIT, until
from toolexec.client import InvocationClient
from toolexec.embedded_broker import EmbeddedBroker
from toolexec.stack import TOPIC_PARTITIONS

pytestmark = pytest.mark.chaos

STEPS = 20
HOLD = 8


def state_after(steps: int) -> dict:
    """The tool's checkpoint state after `steps` steps (as main.py builds it)."""
    return {"done": steps, "steps": {str(s): f"step {s} done" for s in range(steps)}}


def hash_of(state: dict) -> str:
    return state_hash(canonical_json(state))


async def _facts(bootstrap: str, invocation_id: str, state_hash: str | None = None) -> list:
    """The facts of `invocation_id` on the log, read from the start until a checkpoint
    of `state_hash` is there, when one is given (else as the log is now)."""
    def checkpointed(found: list) -> bool:
        return any(e.type == "tool.execution.checkpointed" and e.data.state_hash == state_hash
                   for e in found)

    return await invocation_events(bootstrap, lambda e: e.correlationid == invocation_id,
                                   until=None if state_hash is None else checkpointed)


async def test_kill_9_mid_run_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    state = tmp_path / "state"
    state.mkdir()
    invocation_id = str(uuid.uuid4())
    async with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path) as broker:
        process = start_up(broker.bootstrap, state)
        try:
            await wait_until_up(process, state)
            async with InvocationClient(broker.bootstrap, verifier=verifier_for(state)) as client:
                running = asyncio.create_task(client.invoke(
                    "twenty_steps", {"id": invocation_id, "ledger": str(ledger), "hold": HOLD},
                    invocation_id=invocation_id, timeout=300))
                await _facts(broker.bootstrap, invocation_id, hash_of(state_after(HOLD)))
                process.send_signal(signal.SIGKILL)
                process.wait()
                process = start_up(broker.bootstrap, state)
                result = await running
            assert result.type == "tool.invoke.completed", result.data
            assert result.data.result == {"done": STEPS, "resumed_from": HOLD}
            facts = await _facts(broker.bootstrap, invocation_id)
            terminals = await terminal_event_ids(broker.bootstrap, {invocation_id})
            assert len(terminals[invocation_id]) == 1
            env = {"TOOLEXEC_STATE_DIR": str(state),
                   "TOOLEXEC_KAFKA_BOOTSTRAP": broker.bootstrap}

            def audit_types() -> list[str]:
                replay = toolexec("audit", "replay", "--invocation", invocation_id,
                                  cwd=tmp_path, env=env)
                types = [json.loads(line)["type"] for line in replay.stdout.splitlines()]
                return types if "tool.invoke.completed" in types else []

            audited = until(audit_types, "the audit trail holds the invocation's end", 120)
            verified = toolexec("audit", "verify", "--json", cwd=tmp_path, env=env)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=WAIT)
    # every step done exactly once
    steps = [line.split()[1] for line in ledger.read_text().splitlines()]
    assert Counter(steps) == {str(step): 1 for step in range(STEPS)}
    # attempt 1 interrupted (resumable: not final), attempt 2 resumed and finished
    finished = {e.data.attempt: e.data for e in facts if e.type == "tool.execution.finished"}
    assert sorted(finished) == [1, 2]
    assert finished[1].error.code == "E3404" and not finished[1].final
    assert finished[2].outcome == "success" and finished[2].final
    # the checkpoints: numbered on across the attempts (a burst may be coalesced),
    # the resumed attempt's first one stored as a delta of the one it resumed from
    checkpoints = {}
    for event in facts:
        if event.type == "tool.execution.checkpointed":
            checkpoints.setdefault(event.data.sequence, event.data)
    assert sorted(checkpoints) == list(range(len(checkpoints)))
    by_attempt = {n: [c for _, c in sorted(checkpoints.items()) if c.attempt == n] for n in (1, 2)}
    assert by_attempt[1][-1].state_hash == hash_of(state_after(HOLD))
    assert by_attempt[2][0].delta_of == hash_of(state_after(HOLD))
    assert by_attempt[2][-1].state_hash == hash_of(state_after(STEPS))
    progress = [e.data for e in facts if e.type == "tool.execution.progressed"]
    assert sorted(p.sequence for p in progress) == list(range(len(progress)))
    assert progress[-1].fraction == 1.0
    assert audited.count("tool.execution.checkpointed") == len(checkpoints)
    assert verified.returncode == 0, verified.stdout + verified.stderr
