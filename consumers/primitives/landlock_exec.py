"""The Landlock sandbox of the subprocess primitive: a tiny exec wrapper.

Used when bubblewrap is not installed. A tool without egress is restricted in its
own process between fork and exec: toolexec builds the ruleset (`make_ruleset`) and
the child `enter`s it — sets no_new_privs, drops every capability when it runs as
root, restricts itself — and execs the tool (see consumers.primitives.landlock). A
tool whose egress goes through the relay is started through this file as a wrapper:
`python -I -S landlock_exec.py --ro P ... --rw P ... --dev P ... --net relay:FD --
argv...` (under prlimit, so the rlimits are already set), which does the same and
starts the relay first. Nothing is applied to the toolexec process itself.

What the tool may do afterwards:
- files: read and execute beneath the `--ro` paths (system folders, a handful of
  `/etc` entries, never shadow), read and write the `--dev` files (/dev/null...), and
  anything beneath its own run directory (`--rw`; it is HOME, TMPDIR and cwd). Every
  other path of the host is refused (EACCES), /tmp and /proc included;
- network (Landlock ABI >= 4): no TCP connect or bind at all with `--net deny`.
  Landlock filters TCP only; with `--net deny` as root the wrapper also moves into a
  new, empty network namespace, so UDP reaches nothing either (not so for other
  users: there UDP stays open). With `--net relay:FD` (root only) it moves into a new
  network namespace with only its loopback up, starts the egress relay there on the
  inherited socket FD (see egress_relay) and allows TCP connect to the relay's port
  only: every connection goes through toolexec's egress proxy. Unix sockets bound to
  a path stay reachable (abstract unix sockets are scoped from ABI 6);
- signals and abstract unix sockets (ABI >= 6): scoped to its own Landlock domain, so
  it cannot signal toolexec or any other process outside the sandbox.
Landlock also forbids mount changes and ptrace of processes outside the domain.
The tool keeps the uid of toolexec (no user namespace here): as root it runs with no
capabilities at all (bounding set emptied, so exec grants none), but the kernel never
counts RLIMIT_NPROC for uid 0, and a uid of its own would lock it out of its run
directory whenever an ancestor folder is private (/root, pytest's temporary folders):
no per-run process limit under Landlock, as the executor says at start. bubblewrap,
when installed, is preferred for that.

Only the standard library is used (ctypes syscalls), so the wrapper starts with
`-I -S` (no site, no environment) in ~15 ms and imports nothing of toolexec.
When the sandbox cannot be set up the wrapper writes `landlock_exec: <why>` on stderr
and exits with SETUP_FAILED; the parent reports that as E3405.
"""

from __future__ import annotations

import ctypes
import functools
import os
import stat
import sys

TYPE_CHECKING = False  # not from typing: importing it costs ~5 ms of every start
if TYPE_CHECKING:  # at run time imported only when the relay is used
    import socket
    from types import ModuleType

SETUP_FAILED = 125
MESSAGE_PREFIX = b"landlock_exec: "

_SYSCALLS = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}  # same on
# x86_64, aarch64 and every other architecture using the generic syscall table
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

# filesystem access rights (linux/landlock.h)
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
_READ_ONLY = EXECUTE | READ_FILE | READ_DIR
_DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV
# network access rights (ABI 4) and scopes (ABI 6)
_BIND_TCP, _CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


class SetupError(Exception):
    """The sandbox could not be set up (the tool is not started)."""


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # the C library Python itself links


def _syscall(name: str, *args: object) -> int:
    result = int(_libc().syscall(_SYSCALLS[name], *args))
    if result < 0:
        errno = ctypes.get_errno()
        raise SetupError(f"landlock_{name}: {os.strerror(errno)} (errno {errno})")
    return result


@functools.cache
def abi_version() -> int:
    """The Landlock ABI of the running kernel; 0 when Landlock is unavailable (not
    Linux, kernel too old, or Landlock not among the enabled LSMs)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return _syscall("create_ruleset", None, 0, _CREATE_RULESET_VERSION)
    except (SetupError, OSError, AttributeError):
        return 0


def handled_fs(abi: int) -> int:
    """Every filesystem right the ABI knows (all of them are denied unless granted)."""
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def restrict(read_only: list[str], read_write: list[str], devices: list[str],
             net: str, relay_port: int | None = None) -> int:
    """Restrict this process (and what it execs) as described in the module docstring.
    Returns the ABI used. Raises SetupError when it cannot be done as asked."""
    ruleset, abi = make_ruleset(read_only, read_write, devices, net, relay_port)
    try:
        enter(ruleset, net)
    finally:
        os.close(ruleset)
    return abi


def make_ruleset(read_only: list[str], read_write: list[str], devices: list[str],
                 net: str, relay_port: int | None = None) -> tuple[int, int]:
    """(ruleset fd, ABI): every rule of the module docstring, not yet enforced; the
    caller closes the fd. Raises SetupError when the kernel cannot do what is asked."""
    abi = abi_version()
    if abi < 1:
        raise SetupError("Landlock is not supported by this kernel")
    if net != "allow" and abi < 4:
        raise SetupError(f"Landlock ABI {abi} cannot deny network access (needs ABI 4)")
    fs = handled_fs(abi)
    attr = _RulesetAttr(handled_access_fs=fs)
    size = 8
    if abi >= 4 and net != "allow":
        attr.handled_access_net = _BIND_TCP | _CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        size = 24
    ruleset = _syscall("create_ruleset", ctypes.byref(attr), size, 0)
    try:
        for paths, rights in ((read_only, _READ_ONLY), (read_write, fs), (devices, _DEVICE)):
            for path in paths:
                _allow_path(ruleset, path, rights & fs)
        ports = (net[len("ports:"):] if net.startswith("ports:")
                 else str(relay_port) if net.startswith("relay:") else "")
        if attr.handled_access_net:
            for port in (int(p) for p in ports.split(",") if p):
                rule = _NetPortAttr(allowed_access=_CONNECT_TCP, port=port)
                _syscall("add_rule", ruleset, _RULE_NET_PORT, ctypes.byref(rule), 0)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset, abi


def enter(ruleset: int, net: str, last_capability: int | None = None) -> None:
    """Enforce `ruleset` on this process: as root with `--net deny` a new, empty network
    namespace first, then no_new_privs, every capability dropped (root) and the
    restriction itself. Runs in the process to restrict (the wrapper, or the tool's
    own between fork and exec)."""
    if net == "deny" and os.geteuid() == 0:
        _leave_the_network()
    if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SetupError(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    if os.geteuid() == 0:
        _drop_capabilities(last_capability)
    _syscall("restrict_self", ruleset, 0)


def _allow_path(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # optional system entries (/lib64, /etc/pki...) may be absent
    except OSError as error:
        raise SetupError(f"cannot open {path}: {error.strerror}") from error
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS  # directory rights on a file are refused (EINVAL)
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        _syscall("add_rule", ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0)
    finally:
        os.close(fd)


def _leave_the_network() -> None:
    """As root: a new, empty network namespace (no interface but a loopback that is
    down), so UDP and raw sockets reach nothing either."""
    if _libc().unshare(_CLONE_NEWNET) != 0:
        raise SetupError(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")


def enter_relay_network(relay: ModuleType) -> socket.socket:
    """As root: a new network namespace with only its loopback up, and the egress
    relay's listener on it (made before restricting: binding is refused afterwards)."""
    import fcntl
    import socket
    import struct

    _leave_the_network()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(probe.fileno(), _SIOCGIFFLAGS,
                                                     request))[1]
        fcntl.ioctl(probe.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo",
                                                               flags | _IFF_UP))
    return relay.listen(relay.DEFAULT_PORT)


def last_capability() -> int:
    """The highest capability number of the running kernel."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as file:
        return int(file.read())


def _drop_capabilities(last: int | None = None) -> None:
    """Root keeps uid 0 but loses every capability, now and across exec."""
    libc = _libc()
    if last is None:
        last = last_capability()
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise SetupError(f"cannot drop capability {cap} from the bounding set: "
                             f"{os.strerror(ctypes.get_errno())}")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise SetupError(f"capset: {os.strerror(ctypes.get_errno())}")


def parse(argv: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """(paths by kind, network mode, tool argv) of the wrapper's command line."""
    paths: dict[str, list[str]] = {"--ro": [], "--rw": [], "--dev": []}
    net = "deny"
    rest = list(argv)
    while rest and rest[0] != "--":
        option = rest.pop(0)
        if not rest:
            raise SetupError(f"option {option} lacks a value")
        value = rest.pop(0)
        if option == "--net":
            net = value
        elif option in paths:
            paths[option].append(value)
        else:
            raise SetupError(f"unknown option {option}")
    if len(rest) < 2:
        raise SetupError("no tool command after --")
    return paths, net, rest[1:]


def main(argv: list[str]) -> None:
    listener: socket.socket | None = None
    try:
        paths, net, command = parse(argv)
        # Found before restricting: afterwards this interpreter cannot load the stdlib
        # modules os.execvp would import.
        program = executable(command[0])
        channel, relay = -1, None
        if net.startswith("relay:"):
            channel = int(net[len("relay:"):])
            os.set_inheritable(channel, False)
            if os.geteuid() != 0:
                raise SetupError("the egress relay needs a network namespace (root)")
            relay = _relay_module()
            listener = enter_relay_network(relay)
        restrict(paths["--ro"], paths["--rw"], paths["--dev"], net,
                 None if relay is None else relay.DEFAULT_PORT)
    except (SetupError, OSError, ValueError) as error:
        sys.stderr.buffer.write(MESSAGE_PREFIX + str(error).encode() + b"\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)
    if listener is not None and relay is not None:
        relay.serve_then_exec(listener, channel, command, program)
    try:
        os.execv(program, command)
    except OSError as error:
        sys.stderr.buffer.write(f"{command[0]}: {error.strerror}\n".encode())
        sys.stderr.flush()
        os._exit(127 if isinstance(error, FileNotFoundError) else 126)


def _relay_module() -> ModuleType:
    """The sibling egress_relay module, loaded before restricting (this script runs
    with -I, so its own folder is not on sys.path; nothing is added to it)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "egress_relay.py")
    spec = importlib.util.spec_from_file_location("egress_relay", path)
    if spec is None or spec.loader is None:
        raise SetupError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def executable(program: str) -> str:
    """`program` looked up on PATH as execvp would (first executable file found)."""
    if "/" in program:
        return program
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return program  # execv then reports "No such file or directory" (127)


if __name__ == "__main__":
    main(sys.argv[1:])
