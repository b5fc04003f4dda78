"""The report protocol against real tool processes, in each sandbox: the helper module
on PYTHONPATH, reports read while the tool runs, hostile lines survived, the resumed
state handed in, and a refused checkpoint stopping the tool."""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from consumers.primitives import bubblewrap, landlock, namespace_launcher
from consumers.primitives.file_store import ContentStore
from consumers.primitives.report_file import HELPER_SOURCE, shared_folder
from consumers.primitives.sandbox_cache import shared_cache
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.checkpoints import CheckpointError
from domain.model import PrimitiveOutcome, SubprocessPlan, ToolFile
from domain.tool_reports import Checkpoint, Progress, Report

pytestmark = pytest.mark.integration

FRESH_ROOTS = [
    pytest.param("namespaces", marks=pytest.mark.skipif(not namespace_launcher.usable(),
                                                        reason="the launcher needs root")),
    pytest.param("bwrap", marks=pytest.mark.skipif(bubblewrap.bwrap_binary() is None,
                                                   reason="bubblewrap not installed")),
]
SANDBOXES = [
    "rlimits",
    *FRESH_ROOTS,
    pytest.param("landlock", marks=pytest.mark.skipif(not landlock.available(),
                                                      reason="no Landlock here")),
]

REPORTING_TOOL = """
import json, os, sys
import toolexec_tool
resumed = toolexec_tool.last_checkpoint()
with open(os.environ["TOOLEXEC_REPORT_FILE"], "a") as raw:   # what a hostile tool writes
    raw.write("not json\\n" + "x" * 5_000_000 + "\\n" + '{"progress": NaN}\\n')
for step in range(3):
    toolexec_tool.checkpoint({"done": step + 1})
    toolexec_tool.progress((step + 1) / 3, f"step {step + 1}")
print(json.dumps({"resumed": resumed}))
"""


@dataclass
class RecordingSession:
    resume_state: bytes | None = None
    refuse_checkpoints: bool = False
    received: list[Report] = field(default_factory=list)

    async def receive(self, reports: Sequence[Report]) -> None:
        for report in reports:
            if isinstance(report, Checkpoint) and self.refuse_checkpoints:
                raise CheckpointError("State serialization failed: over the cap", code="E3906")
            self.received.append(report)


def plan(source: str) -> SubprocessPlan:
    content = textwrap.dedent(source).encode()
    files = (ToolFile("main.py", hashlib.sha256(content).hexdigest(), False, content),)
    return SubprocessPlan(argv=("python3", "main.py"), files=files, timeout_seconds=60)


async def run(tmp_path: Path, source: str, session: RecordingSession,
              sandbox: str) -> PrimitiveOutcome:
    return await run_subprocess(plan(source), {}, store=ContentStore(tmp_path / "cas"),
                                work_root=tmp_path / "work", sandbox=sandbox, session=session)


@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_reports_are_read_and_hostile_lines_skipped(tmp_path: Path, sandbox: str) -> None:
    session = RecordingSession()
    outcome = await run(tmp_path, REPORTING_TOOL, session, sandbox)
    assert outcome.ok, outcome
    assert json.loads(outcome.stdout) == {"resumed": None}
    assert [r for r in session.received if isinstance(r, Checkpoint)] == [
        Checkpoint({"done": 1}), Checkpoint({"done": 2}), Checkpoint({"done": 3})]
    assert [r for r in session.received if isinstance(r, Progress)][-1] == Progress(1.0, "step 3")


@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_a_resumed_run_reads_its_last_state(tmp_path: Path, sandbox: str) -> None:
    session = RecordingSession(resume_state=b'{"done":2}')
    outcome = await run(tmp_path, REPORTING_TOOL, session, sandbox)
    assert outcome.ok, outcome
    assert json.loads(outcome.stdout) == {"resumed": {"done": 2}}


@pytest.mark.parametrize("sandbox", FRESH_ROOTS)
async def test_a_fresh_root_runs_report_files_leave_nothing_behind_and_the_helper_is_read_only(
        tmp_path: Path, sandbox: str) -> None:
    session = RecordingSession(resume_state=b'{"done": 1}')
    outcome = await run(tmp_path, """
        import json, os
        import toolexec_tool
        try:
            open(toolexec_tool.__file__, "a").write("# changed")
            helper = "written"
        except OSError:
            helper = "read-only"
        toolexec_tool.progress(0.5, "half")
        print(json.dumps({"helper": helper, "resumed": toolexec_tool.last_checkpoint()}))
    """, session, sandbox)
    assert outcome.ok, (outcome.error, outcome.stderr)
    assert json.loads(outcome.stdout) == {"helper": "read-only", "resumed": {"done": 1}}
    assert [report.message for report in session.received
            if isinstance(report, Progress)] == ["half"]
    folder = shared_folder(shared_cache(bubblewrap.SYSTEM_ETC_ENTRIES).root)
    assert sorted(path.name for path in folder.iterdir()) == [HELPER_SOURCE.name]
    assert HELPER_SOURCE.read_bytes() == (folder / HELPER_SOURCE.name).read_bytes()


async def test_a_refused_checkpoint_stops_the_tool(tmp_path: Path) -> None:
    session = RecordingSession(refuse_checkpoints=True)
    source = """
    import time, toolexec_tool
    toolexec_tool.checkpoint({"big": "state"})
    time.sleep(60)
    """
    outcome = await run(tmp_path, source, session, "rlimits")
    assert not outcome.ok and outcome.error is not None
    assert outcome.error["code"] == "E3906"


async def test_the_helper_does_nothing_outside_toolexec(tmp_path: Path, monkeypatch: Any) -> None:
    import importlib.util

    from consumers.primitives.report_file import HELPER_SOURCE

    spec = importlib.util.spec_from_file_location("toolexec_tool", HELPER_SOURCE)
    assert spec is not None and spec.loader is not None
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    monkeypatch.delenv("TOOLEXEC_REPORT_FILE", raising=False)
    monkeypatch.delenv("TOOLEXEC_CHECKPOINT_FILE", raising=False)
    helper.progress(0.5, "x")
    helper.checkpoint({"a": 1})
    assert helper.last_checkpoint() is None
    report = tmp_path / "r.jsonl"
    monkeypatch.setenv("TOOLEXEC_REPORT_FILE", str(report))
    helper.checkpoint({"a": 1})
    helper.progress(None, "m")
    assert [json.loads(line) for line in report.read_text().splitlines()] == [
        {"checkpoint": {"a": 1}}, {"progress": None, "message": "m"}]
    with pytest.raises(TypeError):
        helper.checkpoint([1])


