"""The operator's sandbox policy: ceilings a manifest can only narrow.

A tool's manifest says what it needs (`resource_limits`, `timeout`); the operator
says what any tool may have at most (`TOOLEXEC_SANDBOX_MAX_*`). `narrow` gives the
limits a run really gets — for each limit the smaller of the two, and the operator's
value where the manifest says nothing — plus a record of every value that was cut
down, so the executor can say so.

Defaults where neither says anything: CPU time is one core for the whole (capped)
wall time, so a CPU limit always exists; the per-run disk quota is the operator's
ceiling; the process count is the operator's ceiling wherever the sandbox gives the
run a process count of its own (left to the sandbox: `max_processes` stays None).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from domain.model import HttpPlan, McpPlan, ResourceLimits, SubprocessPlan

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """Ceilings and allowances set by the operator (never by a manifest).

    `max_*` bound every run; `egress_allowed_networks` are CIDR blocks a tool may
    reach although they are loopback, link-local or private (empty: none);
    `protected_paths` are host folders never shown to a tool, nor any of their
    ancestors (the state directory: database, claims, keys, content store); runs
    started as root each get a uid of their own from `[run_uid_base, run_uid_base +
    run_uid_count)`."""

    max_memory_bytes: int = 2 * GIB
    max_cpu_seconds: int = 300
    max_processes: int = 256
    max_disk_bytes: int = GIB
    max_wall_seconds: float = 600.0
    egress_allowed_networks: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = ()
    run_uid_base: int = 200_000
    run_uid_count: int = 1024

    def __post_init__(self) -> None:
        for name in ("max_memory_bytes", "max_cpu_seconds", "max_processes", "max_disk_bytes",
                     "max_wall_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"sandbox policy {name} must be a positive number, "
                                 f"got {value!r}")


@dataclass(frozen=True, slots=True)
class Narrowed:
    """One value the operator's ceiling cut down: what the manifest asked for (None
    when it asked nothing and the model default was above the ceiling) and what the
    run gets."""

    limit: str
    asked: Any
    granted: Any

    def to_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "asked": self.asked, "granted": self.granted}


def narrow_subprocess(plan: SubprocessPlan,
                      policy: SandboxPolicy) -> tuple[SubprocessPlan, tuple[Narrowed, ...]]:
    """`plan` with its timeout and limits brought under the policy's ceilings."""
    cuts: list[Narrowed] = []
    timeout = _at_most("timeout_seconds", plan.timeout_seconds, policy.max_wall_seconds, cuts)
    limits = plan.limits
    memory = _at_most("memory_bytes", limits.memory_bytes, policy.max_memory_bytes, cuts)
    cpu_default = min(policy.max_cpu_seconds, max(1, math.ceil(timeout)))
    cpu = (cpu_default if limits.cpu_seconds is None
           else _at_most("cpu_seconds", limits.cpu_seconds, policy.max_cpu_seconds, cuts))
    files = _at_most("max_file_bytes", limits.max_file_bytes, policy.max_disk_bytes, cuts)
    # None stays None: the sandbox applies the operator's process ceiling where the
    # run has a process count of its own (see consumers.primitives.sandbox_uids)
    processes = (None if limits.max_processes is None
                 else _at_most("max_processes", limits.max_processes, policy.max_processes,
                               cuts))
    if (memory, cpu, files, processes) != (limits.memory_bytes, limits.cpu_seconds,
                                           limits.max_file_bytes, limits.max_processes):
        limits = dataclasses.replace(limits, memory_bytes=memory, cpu_seconds=cpu,
                                     max_file_bytes=files, max_processes=processes)
    if timeout != plan.timeout_seconds or limits is not plan.limits:
        plan = dataclasses.replace(plan, timeout_seconds=timeout, limits=limits)
    return plan, tuple(cuts)


def narrow_plan(plan: SubprocessPlan | HttpPlan | McpPlan, policy: SandboxPolicy
                ) -> tuple[SubprocessPlan | HttpPlan | McpPlan, tuple[Narrowed, ...]]:
    """Any plan under the policy: a subprocess gets every ceiling, an HTTP request or
    an MCP call the wall-time ceiling (a stdio MCP server's own process is narrowed
    when it is started, as a long-lived process)."""
    if isinstance(plan, SubprocessPlan):
        return narrow_subprocess(plan, policy)
    cuts: list[Narrowed] = []
    timeout = _at_most("timeout_seconds", plan.timeout_seconds, policy.max_wall_seconds, cuts)
    return dataclasses.replace(plan, timeout_seconds=timeout), tuple(cuts)


def disk_quota(limits: ResourceLimits, policy: SandboxPolicy) -> int:
    """Bytes a run may store in all (its run directory and /tmp together, where the
    sandbox can count it): the manifest's `ephemeral_storage` when smaller than the
    operator's ceiling."""
    if limits.max_file_bytes is None:
        return policy.max_disk_bytes
    return min(limits.max_file_bytes, policy.max_disk_bytes)


def _at_most(name: str, asked: Any, ceiling: Any, cuts: list[Narrowed]) -> Any:
    """`asked` when within `ceiling`; the ceiling otherwise (None = "unlimited" is
    above any ceiling)."""
    if asked is None or asked > ceiling:
        cuts.append(Narrowed(name, asked, ceiling))
        return ceiling
    return asked
