"""The Landlock sandbox of the subprocess primitive: the argv prefix (parent side).

The restriction itself is applied in the child by `landlock_exec` (see its docstring
for what a tool may and may not do); this module decides what it is told: the system
folders and `/etc` entries bubblewrap also shows (read and execute only), the install
prefix of the tool's interpreter when it lives outside `/usr`, a few device files,
the run directory read-write, and the network mode from the plan's network policy.
"""

from __future__ import annotations

import sys
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


def network_mode(policy: NetworkPolicy) -> str:
    """`deny`, `allow`, or `ports:P1,P2` (TCP connect to those ports only)."""
    if not bubblewrap.network_allowed(policy):
        return "deny"
    if policy.allowed_ports:
        return "ports:" + ",".join(str(int(port)) for port in policy.allowed_ports)
    return "allow"


def landlock_prefix(workdir: Path, cwd: Path, program: str, path: str, *,
                    network: NetworkPolicy) -> list[str]:
    """The argv that runs `program` (arguments appended by the caller) under Landlock.
    Raises OSError when the kernel cannot enforce what the plan needs."""
    abi = landlock_exec.abi_version()
    if abi < 1:
        raise OSError("Landlock is not supported by this kernel")
    net = network_mode(network)
    if net != "allow" and abi < MIN_NETWORK_ABI:
        raise OSError(f"Landlock ABI {abi} of this kernel cannot deny network access "
                      f"(ABI {MIN_NETWORK_ABI} needed)")
    args = [sys.executable, "-I", "-S", landlock_exec.__file__]
    read_only = [*SYSTEM_FOLDERS, *(f"/etc/{entry}" for entry in bubblewrap.SYSTEM_ETC_ENTRIES)]
    read_only.extend(str(prefix) for prefix in bubblewrap.install_prefixes(program, path, cwd))
    for folder in read_only:
        args += ["--ro", folder]
    for device in DEVICES:
        args += ["--dev", device]
    return [*args, "--rw", str(workdir), "--net", net, "--"]
