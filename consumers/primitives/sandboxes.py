"""Which sandbox a run enters, and the rlimits it runs under.

`resolve_sandbox("auto")` is the fallback order: toolexec's own namespace launcher
when it is usable here (root, and the kernel lets it make the namespaces), else
bubblewrap when installed, else Landlock when the kernel supports it, else plain
rlimits (embedded profile) or no sandbox at all, which fails every run closed with
E3405 (production profile). "namespaces" runs the tool through the launcher
(consumers.primitives.namespace_launcher, launcher_program) with bubblewrap's
isolation — except runs whose network policy allows hosts and long-lived service
processes, which go through bubblewrap (`through_launcher`); "bwrap" runs the tool
inside bubblewrap (consumers.primitives.bubblewrap), "landlock"
through the Landlock exec wrapper (landlock, landlock_exec), "rlimits" applies
rlimits only, "none" nothing. What each sandbox gets beyond its rlimits — the run's
own uid, disk quota, paths, egress relay — is decided by sandbox_launch.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal

from consumers.primitives import bubblewrap, landlock, namespace_launcher
from consumers.primitives.sandbox_launch import Launch
from domain.errors import ExecutionError
from domain.model import ResourceLimits

SANDBOXES: frozenset[str] = frozenset({"namespaces", "bwrap", "landlock", "rlimits", "none"})
NO_SANDBOX = "unavailable"
"""What a strict "auto" resolves to when neither bubblewrap nor Landlock is usable:
every run then fails closed with E3405."""

RLimit = tuple[int, int, int]
PRLIMIT_OPTIONS: dict[int, str] = {
    resource.RLIMIT_AS: "as", resource.RLIMIT_CPU: "cpu", resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_FSIZE: "fsize", resource.RLIMIT_NPROC: "nproc",
}


def resolve_sandbox(requested: str, *, strict: bool = False) -> str:
    """The sandbox to run with. "auto" is "namespaces" when the launcher is usable
    here, else "bwrap" when bubblewrap is installed, else "landlock" when the kernel
    supports Landlock, else "rlimits" — or, when `strict` (the production profile),
    NO_SANDBOX, so that every run fails closed with E3405. Any other name is taken
    as it is (checked at run time)."""
    if requested != "auto":
        return requested
    if namespace_launcher.usable():
        return "namespaces"
    if bubblewrap.bwrap_binary() is not None:
        return "bwrap"
    if landlock.available():
        return "landlock"
    return NO_SANDBOX if strict else "rlimits"


def through_launcher(sandbox: str, *, network_allowed: bool = False,
                     service: bool = False) -> str:
    """The sandbox a run really enters: under "namespaces", a run whose network
    policy allows hosts (the egress relay) and a long-lived service process go
    through bubblewrap, and are recorded so."""
    if sandbox == "namespaces" and (network_allowed or service):
        return "bwrap"
    return sandbox


def check_sandbox(sandbox: str) -> None:
    if sandbox == NO_SANDBOX:
        raise ExecutionError(
            "no sandbox is available: bubblewrap is not installed and this kernel does not "
            "support Landlock; install bubblewrap, or set TOOLEXEC_SANDBOX=rlimits to run "
            "tools with resource limits only", code="E3405", details={"sandbox": sandbox})
    if sandbox == "namespaces" and not namespace_launcher.usable():
        raise ExecutionError("the namespaces sandbox needs root and a kernel that lets it "
                             "make mount, PID and network namespaces", code="E3405",
                             details={"sandbox": sandbox})
    if sandbox not in SANDBOXES:
        raise ExecutionError(f"sandbox {sandbox!r} is not available here", code="E3405",
                             details={"sandbox": sandbox, "available": sorted(SANDBOXES)})


def rlimits_for(limits: ResourceLimits, sandbox: str,
                launch: Launch | None = None) -> tuple[RLimit, ...]:
    """The (resource, soft, hard) triples to set in the child, computed in the parent
    and capped at the current hard limits (which only root may raise)."""
    check_sandbox(sandbox)
    if sandbox == "none":
        return ()
    cpu = limits.cpu_seconds
    processes = limits.max_processes if launch is None else launch.max_processes
    if launch is not None and not launch.nproc_outside:
        processes = None  # set inside the sandbox instead (see bubblewrap)
    wanted = (
        (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
        # soft < hard: SIGXCPU first (reported as E3407), SIGKILL a second later
        (resource.RLIMIT_CPU, cpu, None if cpu is None else cpu + 1),
        (resource.RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files),
        (resource.RLIMIT_FSIZE, limits.max_file_bytes, limits.max_file_bytes),
        (resource.RLIMIT_NPROC, processes, processes),
    )
    root = os.geteuid() == 0
    return tuple(_capped(kind, soft, hard, root) for kind, soft, hard in wanted
                 if soft is not None and hard is not None)


def _capped(kind: int, soft: int, hard: int, root: bool) -> RLimit:
    if not root:
        current_hard = resource.getrlimit(kind)[1]
        if current_hard != resource.RLIM_INFINITY:
            hard = min(hard, current_hard)
    return kind, min(soft, hard), hard


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with(parent: int) -> None:
    """Runs in the child between fork and exec: SIGKILL it when the thread that forked
    it ends (the executor, `parent`, dying); if `parent` is gone already, now."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)


def apply_rlimits(rlimits: tuple[RLimit, ...]) -> None:
    """Runs in the child between fork and exec."""
    for kind, soft, hard in rlimits:
        resource.setrlimit(kind, (soft, hard))
