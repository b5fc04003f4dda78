"""A run's own directory: HOME, TMPDIR and working directory of one tool process.

On the host (`on_host`): a fresh folder under `work_root` holding the tool's files,
removed afterwards — what Landlock, rlimits and long-lived service processes use,
since there the tool writes into a host folder. Under bubblewrap (`in_sandbox`) the
run directory is a tmpfs of the sandbox's own, so nothing is made on the host: the
tool's files come from a materialised tree shared by runs (sandbox_cache.ToolTrees)
and are bound read-only into that tmpfs, at the same paths a host folder would give.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consumers.primitives.file_store import ContentStore
from consumers.primitives.sandbox_cache import ToolTrees
from domain.errors import ExecutionError
from domain.model import SubprocessPlan, ToolFile

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
FRESH_ROOT_SANDBOXES: frozenset[str] = frozenset({"bwrap", "namespaces"})
"""Sandboxes that give a run a fresh root, its run directory a tmpfs of its own."""


@dataclass
class RunDirectory:
    """Where one run lives. `path` and `cwd` are as the tool sees them; `files` is
    the host folder holding the tool's files (laid out as under `path`), `lookup` the
    host folder standing for `cwd` (where a relative program is looked up), `start`
    the host folder the launcher starts in."""

    path: Path
    cwd: Path
    files: Path
    lookup: Path
    start: Path
    _close: Callable[[], None]
    host_root: Path | None = None
    """The work root of a host folder (`on_host`); None inside a sandbox."""

    def close(self) -> None:
        """Give the directory back (idempotent)."""
        close, self._close = self._close, _nothing
        close()

    def forget_with(self, path: Path) -> None:
        """Unlink `path` too once the directory is given back (a host group's entry,
        `host_groups`: by then the group has been killed)."""
        close = self._close

        def close_and_forget() -> None:
            close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

        self._close = close_and_forget


def _nothing() -> None:
    return None


def on_host(store: ContentStore, files: Sequence[ToolFile], work_root: Path,
            cwd_parts: tuple[str, ...]) -> RunDirectory:
    """A fresh host folder under `work_root` with the tool's files in it."""
    workdir = make_workdir(work_root)
    try:
        store.materialise(files, workdir)
        cwd = working_directory(workdir, cwd_parts)
    except BaseException:
        remove_tree(workdir)
        raise
    return RunDirectory(workdir, cwd, workdir, cwd, cwd, lambda: remove_tree(workdir),
                        host_root=work_root)


def in_sandbox(store: ContentStore, files: Sequence[ToolFile], work_root: Path,
               cwd_parts: tuple[str, ...], trees: ToolTrees) -> RunDirectory:
    """A run directory that exists only inside the sandbox (see the module docstring)."""
    tree = trees.lease(store, files)
    # the same path for every run: each run's is a tmpfs in a mount namespace of its
    # own, and a fixed path lets the shared part of its request be reused (run_request)
    path = work_root / "run"
    return RunDirectory(path, path.joinpath(*cwd_parts), tree, tree.joinpath(*cwd_parts),
                        tree, lambda: trees.release(tree))


def make_workdir(work_root: Path) -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix="run-", dir=work_root))
    except FileNotFoundError:
        work_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="run-", dir=work_root))


def working_directory(workdir: Path, parts: tuple[str, ...]) -> Path:
    if not parts:
        return workdir
    cwd = workdir.joinpath(*parts)
    cwd.mkdir(parents=True, exist_ok=True)
    if not cwd.resolve().is_relative_to(workdir.resolve()):
        raise ExecutionError("the working directory escapes the tool root", code="E3401",
                             details={"cwd": "/".join(parts)})
    return cwd


def environment(plan: SubprocessPlan, workdir: Path) -> dict[str, str]:
    """Exactly the plan's variables, a default PATH when it has none, and HOME and
    TMPDIR pointing at the run's own directory. Nothing comes from os.environ."""
    env = dict(plan.env)
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = env["TMPDIR"] = str(workdir)
    return env


def remove_tree(path: Path) -> None:
    def unlock_and_retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            func(target)

    shutil.rmtree(path, onerror=unlock_and_retry)
