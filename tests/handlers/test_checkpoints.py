"""A subprocess tool's reports through the execute step: progress and checkpoint
facts, and resuming a resumable tool from its last checkpoint when its executor died
(the primitive is scripted; tests/integration/test_report_file.py runs real tools)."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from consumers.adapters.checkpoint_store import FileCheckpointStore
from consumers.ports import ToolSession
from domain.canonical_json import canonical_json
from domain.checkpoints import state_hash
from domain.integrity import seal
from domain.model import PrimitiveOutcome
from domain.tool_reports import Checkpoint, Progress
from tests.handlers.conftest import TOOLS, Harness, build_harness
from tests.waiting import WAIT
from toolexec.sources import load_source

OK = PrimitiveOutcome(ok=True, stdout=b'{"echo": "x", "keys": 1}', exit_code=0)


def echo_variant(tmp_path: Path, tool_id: str, extra: str, *,
                 secret_text: bool = False) -> Any:
    """py_echo under another id, with `extra` YAML appended to its manifest (and its
    `text` parameter marked secret)."""
    folder = tmp_path / tool_id
    shutil.copytree(TOOLS / "py_echo", folder)
    manifest = (folder / "tool.yaml").read_text().replace("tool_id: py_echo",
                                                          f"tool_id: {tool_id}")
    if secret_text:
        manifest = manifest.replace("maxLength: 50}", "maxLength: 50, writeOnly: true}")
    (folder / "tool.yaml").write_text(manifest + extra)
    return seal(load_source(folder))


@pytest.fixture
def store(tmp_path: Path) -> FileCheckpointStore:
    return FileCheckpointStore(tmp_path / "checkpoints")


@pytest.fixture
def harness(tmp_path: Path, store: FileCheckpointStore) -> Harness:
    built = build_harness(checkpoints=store)
    built.registry.add(echo_variant(tmp_path, "py_resumable",
                                    "checkpoint_config: {enabled: true}\n"))
    return built


async def test_reports_become_facts_between_started_and_finished(
        harness: Harness, store: FileCheckpointStore) -> None:
    async def reporting(plan: Any, params: Any, *, secrets: Any,
                        session: ToolSession | None = None) -> PrimitiveOutcome:
        assert session is not None and session.resume_state is None
        await session.receive([Progress(0.5, "half way"), Checkpoint({"done": 1})])
        return OK

    harness.runner.run = reporting  # type: ignore[method-assign]
    invocation = await harness.request("py_echo", {"text": "x"})
    types = [e.type for e in harness.of(invocation)]
    started, finished = types.index("tool.execution.started"), types.index(
        "tool.execution.finished")
    assert started < types.index("tool.execution.progressed") < finished
    assert started < types.index("tool.execution.checkpointed") < finished
    [progressed] = [e.data for e in harness.of(invocation, "tool.execution.progressed")]
    assert (progressed.sequence, progressed.fraction, progressed.message) == (0, 0.5, "half way")
    [saved] = [e.data for e in harness.of(invocation, "tool.execution.checkpointed")]
    assert saved.state_hash == state_hash(canonical_json({"done": 1}))
    assert (saved.sequence, saved.attempt, saved.delta_of) == (0, 1, None)
    stored = await store.get(saved.state_hash)
    assert stored is not None and stored.size == saved.size


async def test_progress_messages_are_scrubbed_of_secret_parameters(
        harness: Harness, tmp_path: Path) -> None:
    async def leaking(plan: Any, params: Any, *, secrets: Any,
                      session: ToolSession | None = None) -> PrimitiveOutcome:
        assert session is not None
        await session.receive([Progress(None, f"using {params['text']}")])
        return OK

    harness.runner.run = leaking  # type: ignore[method-assign]
    harness.registry.add(echo_variant(tmp_path, "py_secretive", "", secret_text=True))
    invocation = await harness.request("py_secretive", {"text": "sk-very-secret"})
    [progressed] = harness.of(invocation, "tool.execution.progressed")
    assert progressed.data.message == "using [REDACTED]"


async def _interrupted_run(harness: Harness, tool_id: str) -> tuple[str, Any]:
    """Run `tool_id` until its tool checkpointed twice, then let its executor "die"
    (the run stops where it is, its claim left to a dead owner); returns the
    invocation id and its request."""
    async def dying(plan: Any, params: Any, *, secrets: Any,
                    session: ToolSession | None = None) -> PrimitiveOutcome:
        assert session is not None
        await session.receive([Checkpoint({"done": 1, "big": "a" * 200})])
        await asyncio.sleep(0.3)  # past the coalescing interval: a second checkpoint
        await session.receive([Checkpoint({"done": 2, "big": "a" * 200})])
        raise asyncio.CancelledError  # the process is gone

    harness.runner.run = dying  # type: ignore[method-assign]
    request = harness.request_event(tool_id, {"text": "x"})
    harness.events.append(request)
    await harness.run(request)
    invocation = request.data.invocation_id
    key = f"{invocation}/1"
    harness.claims.rows[key] = dataclasses.replace(harness.claims.rows[key], owner="dead",
                                                   lease_until=0.0)
    return invocation, request


async def test_a_resumable_tool_resumes_from_its_last_checkpoint_in_a_new_attempt(
        harness: Harness) -> None:
    invocation, request = await _interrupted_run(harness, "py_resumable")
    handed: list[bytes | None] = []

    async def resuming(plan: Any, params: Any, *, secrets: Any,
                       session: ToolSession | None = None) -> PrimitiveOutcome:
        assert session is not None
        handed.append(session.resume_state)
        await session.receive([Checkpoint({"done": 3, "big": "a" * 200})])
        return OK

    harness.runner.run = resuming  # type: ignore[method-assign]
    await harness.redeliver(request)
    assert handed == [canonical_json({"done": 2, "big": "a" * 200})]
    finished = [e.data for e in harness.of(invocation, "tool.execution.finished")]
    assert [(f.attempt, f.final, f.outcome) for f in finished] == [
        (1, False, "unknown"), (2, True, "success")]
    assert finished[0].error is not None and finished[0].error.details["resumed"] is True
    saved = [e.data for e in harness.of(invocation, "tool.execution.checkpointed")]
    assert [(c.sequence, c.attempt) for c in saved] == [(0, 1), (1, 1), (2, 2)]
    assert saved[2].delta_of == saved[1].state_hash  # stored against the state resumed
    assert harness.terminal(invocation).type == "tool.invoke.completed"


async def test_a_resumed_attempt_does_not_use_up_a_retry(tmp_path: Path) -> None:
    # Attempt 1 was interrupted (its executor died) and resumed as attempt 2, which
    # failed retriably: the tool has tried once, so max_attempts 2 gives it its retry.
    harness = build_harness(checkpoints=FileCheckpointStore(tmp_path / "checkpoints"))
    harness.registry.add(echo_variant(
        tmp_path, "py_resumable",
        "checkpoint_config: {enabled: true}\nretry_policy: {max_attempts: 2}\n"))
    invocation, request = await _interrupted_run(harness, "py_resumable")
    outcomes = iter([PrimitiveOutcome(ok=False, error={"code": "E3502",
                                                       "message": "unavailable"}), OK])

    async def flaky(plan: Any, params: Any, *, secrets: Any,
                    session: ToolSession | None = None) -> PrimitiveOutcome:
        return next(outcomes)

    harness.runner.run = flaky  # type: ignore[method-assign]
    await harness.redeliver(request)
    finished = [e.data for e in harness.of(invocation, "tool.execution.finished")]
    assert [(f.attempt, f.final, f.outcome) for f in finished] == [
        (1, False, "unknown"), (2, False, "failure"), (3, True, "success")]
    assert harness.terminal(invocation).type == "tool.invoke.completed"


async def test_a_tool_not_declared_resumable_ends_as_unknown(harness: Harness) -> None:
    invocation, request = await _interrupted_run(harness, "py_echo")
    harness.runner.run = lambda *a, **k: pytest.fail("must not run again")  # type: ignore
    await harness.redeliver(request)
    assert harness.terminal(invocation).data.error.code == "E3404"


async def test_a_corrupted_checkpoint_fails_the_resume_with_e3904(
        harness: Harness, store: FileCheckpointStore) -> None:
    invocation, request = await _interrupted_run(harness, "py_resumable")
    for path in store.root.rglob("*"):
        if path.is_file():
            head, _, body = path.read_bytes().partition(b"\n")
            if orjson.loads(head)["delta_of"] is None:
                path.write_bytes(head + b"\n" + body.replace(b"a", b"z"))
    harness.runner.run = lambda *a, **k: pytest.fail("must not run")  # type: ignore
    await harness.redeliver(request)
    assert harness.terminal(invocation).data.error.code == "E3904"


async def test_a_resumed_attempt_can_be_cancelled(harness: Harness) -> None:
    invocation, request = await _interrupted_run(harness, "py_resumable")
    resumed = asyncio.Event()

    async def blocking(plan: Any, params: Any, *, secrets: Any,
                       session: ToolSession | None = None) -> PrimitiveOutcome:
        resumed.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    harness.runner.run = blocking  # type: ignore[method-assign]
    running = asyncio.create_task(harness.redeliver(request))
    await asyncio.wait_for(resumed.wait(), WAIT)
    await harness.cancel(invocation)
    await asyncio.wait_for(running, WAIT)
    assert harness.terminal(invocation).data.error.code == "E3703"


async def test_a_flood_of_reports_is_coalesced_to_the_latest(harness: Harness) -> None:
    async def flooding(plan: Any, params: Any, *, secrets: Any,
                       session: ToolSession | None = None) -> PrimitiveOutcome:
        assert session is not None
        await session.receive([Progress(i / 1000, f"{i}") for i in range(1000)])
        await session.receive([Checkpoint({"done": i}) for i in range(100)])
        return OK

    harness.runner.run = flooding  # type: ignore[method-assign]
    invocation = await harness.request("py_echo", {"text": "x"})
    progressed = [e.data for e in harness.of(invocation, "tool.execution.progressed")]
    assert [p.message for p in progressed] == ["0", "999"]  # the first, then the latest
    saved = [e.data for e in harness.of(invocation, "tool.execution.checkpointed")]
    assert [c.state_hash for c in saved] == [state_hash(canonical_json({"done": n}))
                                            for n in (0, 99)]
