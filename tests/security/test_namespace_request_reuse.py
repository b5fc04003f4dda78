"""Runs under the namespace launcher reuse what their request shares with earlier runs
(consumers.primitives.run_request): a tampered tool file, a changed setting or a
changed manifest limit must never be served what was built before it."""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from consumers.primitives import namespace_launcher
from consumers.primitives.bubblewrap import SYSTEM_ETC_ENTRIES
from consumers.primitives.file_store import ContentStore
from consumers.primitives.sandbox_cache import shared_cache
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.model import PrimitiveOutcome, ResourceLimits, SubprocessPlan, ToolFile
from domain.sandbox_policy import SandboxPolicy

pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(not namespace_launcher.usable(),
                       reason="the namespace launcher needs root"),
]

_REPORT_QUOTA = """
import json, os
stat = os.statvfs(os.environ["HOME"])
print(json.dumps({"quota": stat.f_blocks * stat.f_frsize}))
"""


def _plan(source: str, **changes: Any) -> SubprocessPlan:
    content = textwrap.dedent(source).encode()
    file = ToolFile("main.py", hashlib.sha256(content).hexdigest(), False, content)
    changes.setdefault("timeout_seconds", 60)
    return SubprocessPlan(argv=("python3", "main.py"), files=(file,), **changes)


DEFAULT_POLICY = SandboxPolicy()


async def _run(tmp_path: Path, plan: SubprocessPlan,
               policy: SandboxPolicy = DEFAULT_POLICY) -> PrimitiveOutcome:
    return await run_subprocess(plan, {}, store=ContentStore(tmp_path / "cas"),
                                work_root=tmp_path / "work", sandbox="namespaces", policy=policy)


def _quota(outcome: PrimitiveOutcome) -> int:
    assert outcome.ok, (outcome.error, outcome.stderr)
    return int(json.loads(outcome.stdout)["quota"])


async def test_a_tampered_tool_file_is_never_run_by_a_later_run(tmp_path: Path) -> None:
    plan = _plan("print('the verified file')")
    first = await _run(tmp_path, plan)
    assert first.ok and first.stdout == b"the verified file\n", first.error
    trees = shared_cache(SYSTEM_ETC_ENTRIES).trees.root
    tampered = 0
    for made in trees.glob("*/main.py"):
        if made.read_bytes() == plan.files[0].content:
            os.chmod(made, 0o644)
            made.write_bytes(b"print('tampered')\n")
            tampered += 1
    assert tampered, "no materialised tree holds the tool's file"
    for _ in range(2):
        again = await _run(tmp_path, plan)
        assert again.ok and again.stdout == b"the verified file\n", (again.error, again.stdout)


async def test_a_changed_disk_setting_is_never_served_the_earlier_quota(tmp_path: Path) -> None:
    plan = _plan(_REPORT_QUOTA)
    small, large = 8 * 1024 * 1024, 24 * 1024 * 1024
    assert _quota(await _run(tmp_path, plan, SandboxPolicy(max_disk_bytes=small))) == small
    assert _quota(await _run(tmp_path, plan, SandboxPolicy(max_disk_bytes=large))) == large
    assert _quota(await _run(tmp_path, plan, SandboxPolicy(max_disk_bytes=small))) == small


async def test_a_changed_manifest_limit_is_never_served_the_earlier_quota(
        tmp_path: Path) -> None:
    small, large = 6 * 1024 * 1024, 12 * 1024 * 1024
    for limit in (small, large, small):
        plan = _plan(_REPORT_QUOTA, limits=ResourceLimits(max_file_bytes=limit))
        assert _quota(await _run(tmp_path, plan)) == limit


async def test_a_newly_protected_path_is_never_shown_by_an_earlier_request(
        tmp_path: Path) -> None:
    prefix = tmp_path / "opt" / "interpreter"
    (prefix / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", prefix / "bin" / "python3")
    content = b"import sys; print(sys.executable)\n"
    file = ToolFile("main.py", hashlib.sha256(content).hexdigest(), False, content)
    plan = SubprocessPlan(argv=(str(prefix / "bin" / "python3"), "main.py"), files=(file,),
                          timeout_seconds=60)
    shown = await _run(tmp_path, plan)
    assert shown.ok, (shown.error, shown.stderr)
    refused = await _run(tmp_path, plan, SandboxPolicy(protected_paths=(str(tmp_path / "opt"),)))
    assert not refused.ok and refused.error is not None
    assert refused.error["code"] == "E3405"
    assert "will not show" in refused.error["message"]
