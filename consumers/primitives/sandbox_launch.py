"""How one run enters its sandbox: wrapper argv, extra environment, fds, and cleanup.

`prepare_launch` turns the sandbox name, the (already narrowed) plan and the
operator's SandboxPolicy into a `Launch`:
- bubblewrap: the run's uid (root) or its in-sandbox process limit (otherwise), its
  disk quota as the size of its tmpfs, the paths it may see, and — when its network
  policy allows hosts — the egress relay in front of the tool plus an EgressSession
  deciding each connection outside;
- namespaces (root): the run's uid and the same mount plan as bubblewrap's, as a
  request for the namespace launcher (`Launch.request`);
- Landlock: a ruleset the tool's own process enters before exec, or, when its
  network policy allows hosts, the wrapper with the relay (root only, else E3405);
- rlimits / none: nothing but the rlimits the caller applies.
`Launch.close()` gives back what the run held: its uid and its egress session.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from consumers.primitives import bubblewrap, egress_relay, landlock
from consumers.primitives.egress_proxy import EgressSession
from consumers.primitives.run_directory import RunDirectory
from consumers.primitives.run_request import PartsKey, checked, program_identity
from consumers.primitives.sandbox_cache import shared_cache
from consumers.primitives.sandbox_uids import UidPool, shared_pool
from domain.errors import ExecutionError
from domain.model import SubprocessPlan
from domain.sandbox_policy import SandboxPolicy, disk_quota

log = structlog.get_logger(__name__)

PROXY_URL = f"http://127.0.0.1:{egress_relay.DEFAULT_PORT}"
PROXY_VARIABLES: tuple[str, ...] = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                                    "https_proxy", "all_proxy")


@dataclass
class Launch:
    """What `prepare_launch` decided for one run."""

    prefix: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()
    nproc_outside: bool = True
    entry: landlock.ChildEntry | None = None
    max_processes: int | None = None
    uid: int | None = None
    egress: EgressSession | None = None
    request: dict[str, Any] | None = None
    program_found: bool = False
    """The program, a bare name, was found on PATH as an executable file while the
    request was made (no second lookup before it is sent)."""
    host_group: bool = False
    """The run's processes live on the host, in a group of their own (Landlock,
    rlimits, none): its leader dies with the executor and the group is written down
    (`host_groups`) until it is killed; bubblewrap's and the launcher's PID namespace
    die with the executor by themselves."""
    _pool: UidPool | None = None

    def spawned(self) -> None:
        """The sandbox holds the fds it was given now: close ours."""
        if self.egress is not None:
            self.egress.handed_over()
        if self.entry is not None:
            self.entry.close()

    async def close(self) -> None:
        """Release the run's uid, egress session and ruleset (idempotent)."""
        if self.entry is not None:
            self.entry.close()
        if self.egress is not None:
            egress, self.egress = self.egress, None
            await egress.aclose()
        if self.uid is not None and self._pool is not None:
            uid, self.uid = self.uid, None
            self._pool.release(uid)



def prepare_launch(sandbox: str, plan: SubprocessPlan, run_dir: RunDirectory, path: str,
                   policy: SandboxPolicy,
                   binds: Sequence[tuple[Path, Path]] = ()) -> Launch:
    """The Launch of one run (see the module docstring). `binds`: host files to show
    inside the run directory under bubblewrap, (host, inside), the first read-write
    (the report protocol's files, consumers.primitives.report_file); elsewhere they
    are in the run directory already. Raises ExecutionError E3405 when the sandbox
    cannot be set up as the policy requires."""
    launch = Launch(max_processes=plan.limits.max_processes,
                    host_group=sandbox not in ("namespaces", "bwrap"))
    if sandbox not in ("namespaces", "bwrap", "landlock"):
        return launch
    root = os.geteuid() == 0
    try:
        if sandbox in ("namespaces", "bwrap"):
            if root:
                launch._pool = shared_pool(policy.run_uid_base, policy.run_uid_count)
                launch.uid = launch._pool.lease()
            asked = plan.limits.max_processes
            launch.max_processes = policy.max_processes if asked is None else asked
        if bubblewrap.network_allowed(plan.network):
            launch.egress = EgressSession(plan.network, policy.egress_allowed_networks)
            launch.pass_fds = (launch.egress.child_fd,)
            launch.env = {name: PROXY_URL for name in PROXY_VARIABLES} | {
                "NO_PROXY": "", "no_proxy": ""}
        protected = _protected(policy.protected_paths)
        program = plan.argv[0] if plan.argv else ""
        if sandbox == "namespaces":
            launch.request = _namespaces(launch, run_dir, program, path, plan, policy,
                                         protected, tuple(binds))
        elif sandbox == "bwrap":
            launch.prefix = _bwrap(launch, run_dir, program, path, plan, policy, protected,
                                   root, tuple(binds))
        elif launch.egress is None and not bubblewrap.network_allowed(plan.network):
            launch.entry = landlock.child_entry(run_dir.path, run_dir.cwd, program, path,
                                                protected=protected)
        else:
            launch.prefix = landlock.landlock_prefix(
                run_dir.path, run_dir.cwd, program, path, network=plan.network,
                channel=launch.pass_fds[0] if launch.pass_fds else None, protected=protected)
    except OSError as error:
        _abandon(launch)
        raise ExecutionError(f"the {sandbox} sandbox cannot be set up: {error}", code="E3405",
                             details={"sandbox": sandbox}) from error
    except BaseException:
        _abandon(launch)
        raise
    return launch


def _bwrap(launch: Launch, run_dir: RunDirectory, program: str, path: str,
           plan: SubprocessPlan, policy: SandboxPolicy, protected: tuple[Path, ...],
           root: bool, binds: tuple[tuple[Path, Path], ...]) -> list[str]:
    relay: tuple[str, ...] | None = None
    extra: tuple[Path, ...] = ()
    if launch.egress is not None:
        python, python_prefix = relay_interpreter()
        if python_prefix is not None:
            bubblewrap.check_shown(python_prefix, protected)
            extra = (python_prefix,)
        relay = (python, "-I", "-S", "-c", relay_source(), "--channel", str(launch.pass_fds[0]),
                 "--port", str(egress_relay.DEFAULT_PORT), "--")
    # as root the run's own uid isolates its process count (prlimit outside);
    # without root the limit must be set inside the run's user namespace
    launch.nproc_outside = root
    etc = shared_cache(bubblewrap.SYSTEM_ETC_ENTRIES).etc
    confinement = bubblewrap.Confinement(
        uid=launch.uid, disk_bytes=disk_quota(plan.limits, policy),
        inner_max_processes=None if root else launch.max_processes, relay=relay,
        extra_read_only=extra, protected=protected, files=run_dir.files,
        etc_view=etc.path, etc_binds=etc.refresh(), run_binds=binds)
    return bubblewrap.bwrap_prefix(run_dir.path, run_dir.cwd, program, path, confinement)


def _namespaces(launch: Launch, run_dir: RunDirectory, program: str, path: str,
                plan: SubprocessPlan, policy: SandboxPolicy, protected: tuple[Path, ...],
                binds: tuple[tuple[Path, Path], ...]) -> dict[str, Any]:
    """The launcher's request for this run, without argv, env and rlimits (added
    when it is sent): bubblewrap's mount plan, what every run shows (`system`, made
    ahead by the launcher) apart from the run's own part (`mounts`), built once per
    tool tree, settings and limits (run_request) but for the report files, which are
    bound by path, as bubblewrap does (from a fresh 0700 host folder of ours): a bind
    from an fd opened in the executor's mount namespace is refused (EINVAL) in the
    run's."""
    if launch.uid is None:
        raise OSError("the namespaces sandbox runs as root only")
    cache = shared_cache(bubblewrap.SYSTEM_ETC_ENTRIES)
    found = cache.answers.get(("program", program, path),
                              lambda: program_identity(program, path),
                              lambda found: [*path.split(":"), *(found[:1] if found else ())])
    launch.program_found = found is not None and "/" not in program  # which() found it
    key = PartsKey(
        files=run_dir.files, workdir=run_dir.path, cwd=run_dir.cwd, program=program, path=path,
        found=found, policy=policy, limits=plan.limits,
        protected=protected, etc_view=cache.etc.path, etc_binds=cache.etc.refresh(),
        links=cache.answers.get("merged-usr links", bubblewrap.merged_usr_links,
                                lambda _links: bubblewrap.MERGED_USR_LINKS))
    parts = cache.requests.parts(key)
    own = checked([list(step) for step in bubblewrap.run_bind_mounts(run_dir.path, binds)])
    return {"system": parts.system, "mounts": [*parts.head, *own, *parts.tail],
            "cwd": str(run_dir.cwd), "uid": launch.uid, "gid": launch.uid}


def _protected(paths: tuple[str, ...]) -> tuple[Path, ...]:
    """The operator's protected paths, resolved as the kernel resolves them."""
    return shared_cache(bubblewrap.SYSTEM_ETC_ENTRIES).answers.get(
        ("protected", paths), lambda: tuple(Path(os.path.realpath(p)) for p in paths),
        lambda _resolved: paths)


def _abandon(launch: Launch) -> None:
    if launch.entry is not None:
        launch.entry.close()
    if launch.uid is not None and launch._pool is not None:
        launch._pool.release(launch.uid)
        launch.uid = None
    if launch.egress is not None:
        egress, launch.egress = launch.egress, None
        task = asyncio.get_running_loop().create_task(egress.aclose())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set[asyncio.Task[None]] = set()


@functools.cache
def relay_interpreter() -> tuple[str, Path | None]:
    """The real interpreter running toolexec (the relay needs only its standard
    library) and its install prefix to show read-only (None when under /usr)."""
    real = Path(os.path.realpath(sys.executable))
    if real.is_relative_to("/usr"):
        return str(real), None
    prefix = real.parent.parent if real.parent.name == "bin" else real.parent
    return str(real), prefix


@functools.cache
def relay_source() -> str:
    """The relay's source, run with `python -I -S -c` (no file to show the sandbox)."""
    return Path(egress_relay.__file__).read_text(encoding="utf-8")


def isolation_gaps(sandbox: str, *, root: bool | None = None) -> list[str]:
    """What the operator's policy cannot enforce under `sandbox` on this host."""
    root = os.geteuid() == 0 if root is None else root
    if sandbox == "bwrap":
        return []
    if sandbox == "namespaces":
        if not root:
            return ["everything: the namespaces sandbox runs as root only (E3405)"]
        if bubblewrap.bwrap_binary() is None:
            return ["egress and stdio MCP servers: tools whose network policy allows "
                    "hosts and long-lived servers go through bubblewrap, which is not "
                    "installed: they fail with E3405"]
        return []
    if sandbox == "landlock":
        gaps = ["disk: no per-run quota under Landlock, only the largest file is limited"]
        if root:
            gaps.append("processes: tools run as uid 0 without capabilities, which the "
                        "kernel never counts for RLIMIT_NPROC: no process limit (install "
                        "bubblewrap)")
        else:
            gaps += ["processes: every run shares toolexec's uid, so one run's processes "
                     "count against every other's (install bubblewrap)",
                     "egress: tools whose network policy allows hosts fail with E3405 "
                     "(filtering needs a network namespace: bubblewrap or root)"]
        return gaps
    return ["processes: no per-run process count", "disk: no per-run quota",
            "egress: tools whose network policy allows hosts reach the host's network "
            "unfiltered, loopback included",
            "filesystem: the tool sees what toolexec's uid sees"]


def warn_about_isolation(sandbox: str) -> None:
    """Say loudly, once at start, what this sandbox leaves open."""
    gaps = isolation_gaps(sandbox)
    if gaps:
        log.warning("sandbox.isolation_incomplete", sandbox=sandbox, gaps=gaps)
    else:
        log.info("sandbox.isolation", sandbox=sandbox, per_run_uid=os.geteuid() == 0,
                 process_limit="own uid" if os.geteuid() == 0 else "own user namespace",
                 disk="tmpfs quota", egress="proxy")
