"""The shared part of a namespace-launcher run's request, built once and reused.

Per run the launcher's request (sandbox_launch) holds what every run shows (`system`)
and the run's own mounts: its run directory, the tool's files bound from their
materialised tree, the report files and its interpreter's install prefixes. All but
the report files (fresh per run) follow from a few inputs, so they are built, and
their paths checked, once per distinct set of them and kept (`RequestParts`):

- the tool tree's folder: a tree whose files no longer match their verified objects
  is made again in a new folder (sandbox_cache.ToolTrees), so a tampered file never
  meets a request built for the old one;
- the run and working directory, the program and PATH, and what the program is found
  as on PATH now (its path and the identity of the file it resolves to: a program
  replaced or a link moved is a different key);
- the whole SandboxPolicy (settings) and the plan's ResourceLimits (manifest limits);
- the protected paths as resolved now, the `/etc` view's folder, what is bound on its
  mount points (refreshed per run) and which merged-usr links are symlinks.

What stays per run: the uid, the run's id, argv, environment, rlimits and the
report files' binds, checked when the request is sent.
"""

from __future__ import annotations

import os
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from consumers.primitives import bubblewrap, launcher_program
from domain.model import ResourceLimits
from domain.sandbox_policy import SandboxPolicy, disk_quota

_KEEP = 128
Step = list[str | int]


@dataclass(frozen=True)
class RequestParts:
    """The parts of a run's request that its key decides: `system` (made ahead by
    the launcher), the run's mounts before its report binds (`head`: run directory
    and tool files) and after them (`tail`: install prefixes)."""

    system: list[Step]
    head: list[Step]
    tail: list[Step]


@dataclass(frozen=True)
class PartsKey:
    """Everything a RequestParts is built from (see the module docstring)."""

    files: Path
    workdir: Path
    cwd: Path
    program: str
    path: str
    found: tuple[str, int, int, int] | None
    policy: SandboxPolicy
    limits: ResourceLimits
    protected: tuple[Path, ...]
    etc_view: Path
    etc_binds: tuple[str, ...]
    links: tuple[bool, ...]


def program_identity(program: str, path: str) -> tuple[str, int, int, int] | None:
    """Where `program` is found now (absolute, or on `path`) and the identity of the
    file it resolves to (device, inode, change time); None when not found or when it
    is relative to the run's directory (no install prefix then)."""
    if program.startswith("/"):
        found: str | None = program
    elif "/" in program:
        return None
    else:
        found = shutil.which(program, path=path)
    if found is None:
        return None
    try:
        info = os.stat(found)
    except OSError:
        return None
    return found, info.st_dev, info.st_ino, info.st_ctime_ns


class RequestCache:
    """RequestParts by PartsKey, the most recently used kept (at most `keep`)."""

    def __init__(self, keep: int = _KEEP) -> None:
        self._keep = keep
        self._parts: OrderedDict[PartsKey, RequestParts] = OrderedDict()
        self.built = 0

    def parts(self, key: PartsKey) -> RequestParts:
        """The parts for `key`, built (and their steps checked) on a miss. Raises
        bubblewrap.UnsafeMount for a path that must not be shown."""
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts[key] = _build(key)
            self.built += 1
            while len(self._parts) > self._keep:
                self._parts.popitem(last=False)
        else:
            self._parts.move_to_end(key)
        return parts


def _build(key: PartsKey) -> RequestParts:
    confinement = bubblewrap.Confinement(
        disk_bytes=disk_quota(key.limits, key.policy), protected=key.protected,
        files=key.files, etc_view=key.etc_view, etc_binds=key.etc_binds)
    head = bubblewrap.run_mounts(key.workdir, key.cwd, key.program, key.path,
                                 confinement, prefixes=False)
    tail = bubblewrap.prefix_mounts(key.program, key.path, key.cwd, confinement)
    system = bubblewrap.system_mounts(confinement, key.links)
    parts = RequestParts([list(step) for step in system],
                         [list(step) for step in head], [list(step) for step in tail])
    checked(parts.system + parts.head + parts.tail)
    return parts


def checked(steps: list[Step]) -> list[Step]:
    """`steps`, once launcher_program.check_steps accepts them (UnsafeMount else)."""
    try:
        launcher_program.check_steps(steps)
    except ValueError as error:
        raise bubblewrap.UnsafeMount(f"malformed mount plan: {error}") from error
    return steps
