"""Issue 14, door 2: the sandbox decides what a tool sees, not the tool's author.

Repro of the hole: a script tool set `config.command: /bin/python3`, its install
prefix became `/`, bubblewrap showed the whole host read-only, and the tool copied
the state directory's database (every caller's parameters), runtime.json and the
host's /proc. Now a leaf cannot change its runtime's command, `/bin/python3` is just
`/usr/bin/python3`, and no folder holding (or inside) the state directory, no
top-level folder and no pseudo-filesystem is ever shown to a tool.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.primitives import bubblewrap
from consumers.primitives.file_store import ContentStore
from consumers.primitives.runner import Primitives
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.integrity import seal
from domain.model import ResolvedChain, SubprocessPlan
from domain.plan import build_plan
from domain.sandbox_policy import SandboxPolicy
from tests.security.conftest import build_secure_harness, rs256
from toolexec.sources import load_builtin_sources, load_source

pytestmark = [pytest.mark.security]

TOOLS = Path(__file__).parent / "tools"
MARKER = "EVERY CALLER'S PARAMETERS"


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory as `toolexec up` leaves it, readable by anyone (0755, a 0644
    database), so that only the sandbox stands between a tool and it."""
    base = Path(tempfile.mkdtemp(prefix="toolexec-door2-", dir="/var/tmp"))
    base.chmod(0o755)
    state = base / "state"
    state.mkdir(mode=0o755)
    for name, text in (("toolexec.db", MARKER), ("runtime.json", '{"gateway_url": "x"}')):
        (state / name).write_text(text)
        (state / name).chmod(0o644)
    try:
        yield state
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _policy(state: Path) -> SandboxPolicy:
    return SandboxPolicy(protected_paths=(str(state),))


def _targets(state: Path) -> list[str]:
    return [str(state / "toolexec.db"), str(state / "runtime.json"), "/proc/1/cmdline"]


async def test_a_script_cannot_swap_its_runtimes_interpreter(rsa_key, state_dir: Path,
                                                              sandbox: str) -> None:
    runner = Primitives(ContentStore(state_dir / "cas"), state_dir / "work", sandbox=sandbox)
    harness, _, _ = build_secure_harness([rsa_key.public_key()], runner=runner)
    harness.registry.add(seal(load_source(TOOLS / "runtime_hijack")))
    invocation = await harness.request(
        "runtime_hijack", {"targets": _targets(state_dir)},
        token=rs256(rsa_key, tool="runtime_hijack"))
    await runner.aclose()
    terminal = harness.terminal(invocation)
    assert terminal.type == "tool.invoke.failed", terminal.data
    error = terminal.data.error
    assert error.code == "E3105" and "config.command" in error.message
    assert harness.of(invocation, "tool.execution.started") == []  # nothing ran
    for event in harness.events:
        assert MARKER not in event.data.model_dump_json(), event.type


async def test_an_interpreter_named_through_bin_shows_the_tool_nothing_of_the_host(
        state_dir: Path, sandbox: str) -> None:
    """A runtime (trusted, published by an admin) naming `/bin/python3`: on a merged-usr
    host that is /usr/bin/python3, and the tool still sees only what it always sees."""
    chain = _chain(load_source(TOOLS / "runtime_hijack"), command="/bin/python3")
    plan = build_plan(chain)
    assert isinstance(plan, SubprocessPlan) and plan.argv[0] == "/bin/python3"
    outcome = await run_subprocess(plan, {"targets": _targets(state_dir)},
                                   store=ContentStore(state_dir / "cas"),
                                   work_root=state_dir / "work", sandbox=sandbox)
    assert outcome.ok, (outcome.error, outcome.stderr)
    seen = json.loads(outcome.stdout)
    assert seen[str(state_dir / "toolexec.db")].startswith("refused")
    assert seen[str(state_dir / "runtime.json")].startswith("refused")
    # its own PID namespace, whose PID 1 is the sandbox's, not the host's init
    assert ("bwrap" if sandbox == "bwrap" else "launcher_program") in seen["/proc/1/cmdline"]


async def test_a_program_in_a_folder_holding_the_state_directory_is_refused(
        state_dir: Path, sandbox: str) -> None:
    """An interpreter whose install prefix would be an ancestor of the state directory
    (here: `<base>/bin/python3` next to `<base>/state`) is never bound: E3405."""
    base = state_dir.parent
    (base / "bin").mkdir()
    os.symlink("/usr/bin/python3", base / "bin" / "python3")
    chain = _chain(load_source(TOOLS / "runtime_hijack"), command=str(base / "bin" / "python3"))
    outcome = await run_subprocess(build_plan(chain), {"targets": _targets(state_dir)},
                                   store=ContentStore(state_dir / "cas"),
                                   work_root=state_dir / "work", sandbox=sandbox,
                                   policy=_policy(state_dir))
    assert not outcome.ok and outcome.error["code"] == "E3405", outcome
    assert "state directory" in outcome.error["message"]
    assert MARKER.encode() not in outcome.stdout


@pytest.mark.parametrize("folder", ["/", "/etc", "/proc/self"])
def test_the_host_root_top_level_folders_and_pseudo_filesystems_are_never_shown(
        folder: str) -> None:
    with pytest.raises(bubblewrap.UnsafeMount):
        bubblewrap.check_shown(Path(folder))


def _chain(leaf_source, *, command: str) -> ResolvedChain:
    """The leaf (its own `config.command` dropped) on a python runtime running `command`."""
    builtins = {s.manifest["tool_id"]: s for s in load_builtin_sources()}
    runtime = builtins["python_runtime"]
    runtime_manifest = {**runtime.manifest,
                        "config": {**runtime.manifest["config"], "command": command}}
    leaf_manifest = {**leaf_source.manifest,
                     "config": {k: v for k, v in leaf_source.manifest["config"].items()
                                if k != "command"}}
    return ResolvedChain((
        seal(type(leaf_source)(manifest=leaf_manifest, files=leaf_source.files, origin="test")),
        seal(type(runtime)(manifest=runtime_manifest, files=runtime.files, origin="test")),
        seal(builtins["subprocess"])))
