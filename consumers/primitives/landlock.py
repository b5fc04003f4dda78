"""The Landlock sandbox of the subprocess primitive: the argv prefix (parent side).

The restriction itself is applied in the child by `landlock_exec` (see its docstring
for what a tool may and may not do); this module decides what it is told (and, for a tool without egress, builds the ruleset its
process enters before exec: `child_entry`): the system
folders and `/etc` entries bubblewrap also shows (read and execute only), the install
prefix of the tool's interpreter when it lives outside `/usr` (never one bubblewrap
would refuse to show), a few device files, the run directory read-write, and the
network mode: `deny`, or `relay` — a private network
namespace whose only way out is the egress relay and proxy, as under bubblewrap.
A relay needs a network namespace of its own, which only root can make here: without
root a tool whose policy allows hosts fails closed (E3405) rather than reach the
host's network unfiltered.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from consumers.primitives import bubblewrap, landlock_exec
from domain.model import NetworkPolicy

SYSTEM_FOLDERS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
DEVICES: tuple[str, ...] = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
MIN_NETWORK_ABI = 4
"""The first Landlock ABI that can refuse TCP connect and bind."""


def available() -> bool:
    """True when the running kernel supports Landlock."""
    return landlock_exec.abi_version() >= 1


def network_mode(policy: NetworkPolicy, channel: int | None = None) -> str:
    """`deny`, or `relay:FD` (the egress relay on that inherited socket) when the
    policy allows hosts."""
    if not bubblewrap.network_allowed(policy):
        return "deny"
    if channel is None:
        raise OSError("the tool's network policy allows hosts, and its egress cannot be "
                      "filtered here")
    if os.geteuid() != 0:
        raise OSError("filtering a tool's egress under Landlock needs a network namespace "
                      "of its own, which only root can make here: install bubblewrap")
    return f"relay:{channel}"


def landlock_prefix(workdir: Path, cwd: Path, program: str, path: str, *,
                    network: NetworkPolicy, channel: int | None = None,
                    protected: tuple[Path, ...] = ()) -> list[str]:
    """The argv that runs `program` (arguments appended by the caller) under Landlock
    through the wrapper (needed for the egress relay). Raises OSError when the kernel
    cannot enforce what the plan needs."""
    _check_kernel()
    net = network_mode(network, channel)
    args = [sys.executable, "-I", "-S", landlock_exec.__file__]
    for folder in _read_only(cwd, program, path, protected):
        args += ["--ro", folder]
    for device in DEVICES:
        args += ["--dev", device]
    return [*args, "--rw", str(workdir), "--net", net, "--"]


@dataclass
class ChildEntry:
    """A ruleset built here, entered by the tool's own process between fork and exec
    (its spawn's preexec): no wrapper to start, no network (`--net deny`)."""

    ruleset: int
    last_capability: int

    def __call__(self) -> None:
        landlock_exec.enter(self.ruleset, "deny", self.last_capability)

    def close(self) -> None:
        """Close the ruleset (idempotent); the child holds its own copy once spawned."""
        ruleset, self.ruleset = self.ruleset, -1
        if ruleset >= 0:
            os.close(ruleset)


def child_entry(workdir: Path, cwd: Path, program: str, path: str, *,
                protected: tuple[Path, ...] = ()) -> ChildEntry:
    """The ChildEntry of a tool without egress. Raises OSError as `landlock_prefix`."""
    _check_kernel()
    try:
        ruleset, _ = landlock_exec.make_ruleset(
            _read_only(cwd, program, path, protected), [str(workdir)], list(DEVICES), "deny")
    except landlock_exec.SetupError as error:
        raise OSError(str(error)) from error
    return ChildEntry(ruleset, landlock_exec.last_capability())


def _check_kernel() -> None:
    abi = landlock_exec.abi_version()
    if abi < 1:
        raise OSError("Landlock is not supported by this kernel")
    if abi < MIN_NETWORK_ABI:
        raise OSError(f"Landlock ABI {abi} of this kernel cannot deny network access "
                      f"(ABI {MIN_NETWORK_ABI} needed)")


def _read_only(cwd: Path, program: str, path: str, protected: tuple[Path, ...]) -> list[str]:
    """System folders, the /etc entries bubblewrap shows, the interpreter's prefix."""
    read_only = [*SYSTEM_FOLDERS, *(f"/etc/{entry}" for entry in bubblewrap.SYSTEM_ETC_ENTRIES)]
    read_only.extend(str(prefix) for prefix in
                     bubblewrap.install_prefixes(program, path, cwd, protected=protected))
    return read_only
