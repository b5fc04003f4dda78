"""The namespace launcher: a small process that starts sandboxed runs for one executor.

Started once per executor event loop by consumers.primitives.namespace_launcher as
`python -I -S launcher_program.py FD PARENT_PID ROOT` (standard library only,
nothing of toolexec imported), connected to the executor by nothing but the
SOCK_SEQPACKET socket FD it inherited; ROOT is an empty private folder to mount
each run's new root on. It dies with the executor (PR_SET_PDEATHSIG), and on end of
file of that socket it kills every run it started and exits.

A request is one JSON message with the tool's stdin, stdout and stderr and detached
copies of the host paths the run binds (SCM_RIGHTS), sent by the executor straight
to the run's PID 1. The launcher only clones PID 1s and hands them to the executor
(`prepared`: its pid, with a pidfd of it and the launcher's end of its "inbox"):
spares for the `system` part last asked for (as many as the executor last asked
for, one unless runs go side by side), handed out unasked and replaced once used,
and one cloned at once for each `prepare` message (answered before any spare). It reaps every PID 1 and
reports its end. Each run's PID 1 is cloned *ahead* of its request, in new mount, PID, IPC, UTS and
cgroup namespaces and the network namespace the launcher sits in (a fresh one,
loopback up, that the launcher leaves for another right after), and:
1. ahead: makes every mount private, mounts a tmpfs as its new root, applies the
   `system` mounts every run shows (/usr and its links, /etc, /proc, /dev), pivots
   into it and detaches the old root (that detach waits for an RCU grace period,
   up to ~1.5 ms measured), empties its capability bounding, inheritable and
   ambient sets and sets no_new_privs; makes the run's tmpfs and its folders as the
   last request laid them out (`layout`, see `layout_of`), then waits for its request
   on a socketpair of its own (its "inbox");
2. the executor sends it a request for the same `system` mounts, without them (a
   spare that no longer fits gets an empty message and exits), with detached copies of
   the host paths the run binds (open_tree, made read-only with mount_setattr: the
   PID 1 no longer sees the host); the PID 1 checks the request again;
3. the PID 1 attaches those copies (move_mount) and makes the run's own tmpfs,
   folders and links (the tmpfs and folders it made ahead are kept when the request
   lays them out the same, else detached first), remounts its root read-only,
   enters the working directory, sets the rlimits, drops every supplementary group
   and takes the run's uid/gid as its real ids, its effective ids staying 0 (see
   `become_run_user`), and spawns
   the tool with posix_spawn (no copy of this process) in a new session, every
   signal at its default, with POSIX_SPAWN_RESETIDS: the tool has the run's ids and
   no capability. The PID 1 is root again right after and closes its inbox, upon
   which the launcher clones the next spare (not while this run is being set up);
4. the PID 1 waits for the tool, sends `exit` with its wait status and rusage on
   the executor's socket and exits REPORTED (0): the kernel then kills whatever is
   left in the namespace. A PID 1 that ended otherwise (killed, a setup failure, a
   report it could not send: exit 126) is reported by the launcher, `exit` with the
   PID 1's own status, once it reaped it; the executor keeps the first report.
A malformed `prepare` is answered `error`; a PID 1 that fails before exec writes
`toolexec-launcher: <why>` on the tool's stderr and exits SETUP_FAILED (exec
failures exit 127).
"""

import ctypes
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import sys

SETUP_FAILED = 125
REPORTED = 0
"""A PID 1's exit status once it reported its tool's end itself (or was not needed):
the launcher then sends no report of its own (one message, one wake-up less per run).
Every other end of a PID 1 (a setup failure, a report that could not be sent, a kill)
is reported by the launcher with the PID 1's status."""
_UNREPORTED_TOOL_EXIT = 126
"""The PID 1's exit when its report could not be sent (the tool's own status is lost;
never REPORTED, so that the launcher reports this end)."""
MESSAGE_PREFIX = b"toolexec-launcher: "
MAX_MESSAGE = 4 * 1024 * 1024
MAX_FDS = 64
MAX_SPARES = 8
"""The most PID 1s cloned ahead at once (what the executor asks for while runs are
in flight side by side)."""
LAUNCHER_NICE = -10
"""How much more CPU weight the launcher and its PID 1s get than the executor: one
process serves every run of the executor, and at the executor's own weight it
queued behind the runs' processes under load (see docs/sandbox.md). Tools run at
the executor's nice value (`_tool_nice`), never at this one."""
_tool_nice = 0
_batched = False
"""This launcher runs under SCHED_BATCH (see `boost`): its work and its PID 1s' setup
never preempt a running tool when they wake (the kernel lets only a tick preempt for
a batch task), at the same CPU weight. A PID 1 goes back to SCHED_OTHER once it
waits for its request (a request is on a run's path: it must wake it at once) and to
SCHED_BATCH again when it has reported, for its namespaces' teardown."""

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
CLONE_FLAGS = (_CLONE_NEWNS | _CLONE_NEWCGROUP | _CLONE_NEWUTS | _CLONE_NEWIPC
               | _CLONE_NEWPID | signal.SIGCHLD)
"""The run's network namespace is not made by the clone (~0.4 ms): see `fresh_network`."""
_SYS_CLONE = 56  # x86_64
_SYS_PIVOT_ROOT = 155
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _AT_EMPTY_PATH, _AT_FDCWD, _MOVE_MOUNT_F_EMPTY_PATH = 1, 0x1000, -100, 4
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 1, 2, 4
_BINDS = ("ro_bind", "bind", "ro_bind_try")
_SYS_CAPGET, _SYS_CAPSET = 125, 126
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 1, 24, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux; not in the socket module
_CAPABILITY_VERSION_3 = 0x20080522
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = (("/proc/self/fd", "fd"), ("/proc/self/fd/0", "stdin"),
              ("/proc/self/fd/1", "stdout"), ("/proc/self/fd/2", "stderr"),
              ("/proc/kcore", "core"), ("pts/ptmx", "ptmx"))

_libc = ctypes.CDLL(None, use_errno=True)
_clone_libc = ctypes.PyDLL(None, use_errno=True)  # keeps the GIL across clone
for _name in ("mount", "umount2", "prctl", "syscall", "unshare"):
    getattr(_libc, _name).restype = ctypes.c_int
_libc.syscall.restype = ctypes.c_long
_clone_libc.syscall.restype = ctypes.c_long


class SetupError(Exception):
    """A step of entering the sandbox failed."""


def _check(result, what):
    if result < 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")
    return result


def _mount(source, target, fstype, flags, data=None):
    _check(_libc.mount(None if source is None else source.encode(), target.encode(),
                       None if fstype is None else fstype.encode(), ctypes.c_ulong(flags),
                       None if data is None else data.encode()), f"mount {target}")


# -- the mount plan -------------------------------------------------------------------

def _inside(root, path):
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path \
            or "/../" in path + "/" or "/./" in path + "/":
        raise SetupError(f"not an absolute, normalised path: {path!r}")
    return root + path


def _bind(source, target, read_only, devices=False):
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if not os.path.lexists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444))
    _mount(source, target, None, _MS_BIND)
    flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID | (0 if devices else _MS_NODEV)
    _mount(None, target, None, flags | (_MS_RDONLY if read_only else 0))


def _make_dir(path, mode):
    try:  # noqa: SIM105 - the launcher imports as little as it can
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    os.chmod(path, mode)


def _dev(target):
    _make_dir(target, 0o755)
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID, "mode=0755")
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _bind(f"/dev/{name}", f"{target}/{name}", read_only=False, devices=True)
    os.mkdir(f"{target}/shm", 0o755)
    os.mkdir(f"{target}/pts", 0o755)
    _mount("devpts", f"{target}/pts", "devpts", _MS_NOSUID | _MS_NOEXEC,
           "newinstance,ptmxmode=0666,mode=620")
    for link, name in _DEV_LINKS:
        os.symlink(link, f"{target}/{name}")


def apply_mount(root, op):
    """One step of the mount plan, inside the new root `root`."""
    kind = op[0]
    if kind == "ro_bind" or kind == "bind":
        _bind(op[1], _inside(root, op[2]), read_only=kind == "ro_bind")
    elif kind == "ro_bind_try":
        if os.path.exists(op[1]):
            _bind(op[1], _inside(root, op[2]), read_only=True)
    elif kind == "dir":
        _make_dir(_inside(root, op[1]), int(op[2]))
    elif kind == "tmpfs":
        target = _inside(root, op[1])
        _make_dir(target, 0o755)
        _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV,
               f"mode={int(op[2]):o},size={int(op[3])}")
    elif kind == "symlink":
        os.symlink(op[1], _inside(root, op[2]))
    elif kind == "proc":
        target = _inside(root, op[1])
        _make_dir(target, 0o555)
        _mount("proc", target, "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    elif kind == "dev":
        _dev(_inside(root, op[1]))
    else:
        raise SetupError(f"unknown mount step {kind!r}")


def prepare_root(root, system):
    """Steps 1 and 2 for what every run shows (/usr, /etc, /proc, /dev...), done
    ahead: the new root is entered and the old one detached (that detach waits for
    the kernel's RCU grace period, up to ~1.5 ms measured) before any run waits."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    for op in system:
        apply_mount(root, op)
    os.chdir(root)
    _check(_libc.syscall(_SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", _MNT_DETACH), "detach the old root")
    os.chdir("/")


def layout_of(mounts):
    """The leading steps of a run's mounts a spare PID 1 can make ahead: a tmpfs and
    the folders inside it that follow it (empty when the mounts begin otherwise).
    They carry nothing of a run but paths, modes and a size, and a PID 1 serves one
    run, so a tmpfs made ahead is as fresh as one made on the run's path."""
    if not mounts or not isinstance(mounts[0], list) or mounts[0][:1] != ["tmpfs"] \
            or len(mounts[0]) < 2 or not isinstance(mounts[0][1], str):
        return []
    layout, inside = [mounts[0]], mounts[0][1].rstrip("/") + "/"
    for op in mounts[1:]:
        if not (isinstance(op, list) and op[:1] == ["dir"] and len(op) > 1
                and isinstance(op[1], str) and op[1].startswith(inside)):
            break
        layout.append(op)
    return layout


def lay_out(layout):
    """Make `layout` (from `layout_of`) in the new root ahead of the request: the
    steps made, empty when they could not be (nothing of them is left then)."""
    try:
        for op in layout:
            apply_mount("", op)
        return layout
    except (OSError, SetupError, ValueError, TypeError, IndexError):
        _undo_layout(layout)  # not empty: a step of it failed
        return []


def _undo_layout(layout):
    target = _inside("", layout[0][1])
    if os.path.ismount(target):
        _check(_libc.umount2(target.encode(), _MNT_DETACH), f"detach {target}")


def enter_root(mounts, trees, made=()):
    """The run's own mounts, inside the new root: its binds are `trees`, detached
    copies of the host paths the launcher made (open_tree) and attaches here
    (move_mount); then the root is made read-only. `made`: the layout made ahead
    (`lay_out`), kept when the mounts begin with it, else detached first."""
    if made and mounts[:len(made)] == made:
        mounts = mounts[len(made):]
    elif made:
        _undo_layout(made)
    for op in mounts:
        if op[0] == "tree":
            _attach(trees[int(op[1])], _inside("", op[2]), bool(op[3]))
        else:
            apply_mount("", op)
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _attach(tree, target, folder):
    if folder:
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if not os.path.lexists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444))
    _check(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, target.encode(),
                         _MOVE_MOUNT_F_EMPTY_PATH), f"attach {target}")


def detached_trees(mounts):
    """For the run's binds, detached copies of the host paths (read-only but for
    "bind"), made in the launcher: the run's own mounts as the PID 1 applies them,
    and the trees' fds."""
    steps, trees = [], []
    try:
        for op in mounts:
            if op[0] not in _BINDS:
                steps.append(op)
                continue
            if op[0] == "ro_bind_try" and not os.path.exists(op[1]):
                continue
            tree = _check(_libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, str(op[1]).encode(),
                                        _OPEN_TREE_CLONE | os.O_CLOEXEC), f"copy {op[1]}")
            trees.append(tree)
            attributes = (ctypes.c_uint64 * 4)(
                _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
                | (0 if op[0] == "bind" else _MOUNT_ATTR_RDONLY), 0, 0, 0)
            _check(_libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, attributes,
                                 ctypes.sizeof(attributes)), f"make {op[1]} read-only")
            steps.append(["tree", len(trees) - 1, op[2], int(os.path.isdir(op[1]))])
    except BaseException:
        for tree in trees:
            os.close(tree)
        raise
    return steps, trees


def fresh_network():
    """Move this process into a new network namespace with its loopback up."""
    _check(_libc.unshare(_CLONE_NEWNET), "unshare the network namespace")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = bytearray(40)
        request[:3] = b"lo\0"
        fcntl.ioctl(probe.fileno(), _SIOCGIFFLAGS, request, True)
        flags = int.from_bytes(request[16:18], "little") | _IFF_UP
        request[16:18] = flags.to_bytes(2, "little")
        fcntl.ioctl(probe.fileno(), _SIOCSIFFLAGS, bytes(request))


# -- the tool's process -----------------------------------------------------------------

def drop_capabilities():
    """What the tool inherits of the PID 1's capabilities, settled ahead: an empty
    bounding, inheritable and ambient set, and no_new_privs. The PID 1 keeps its
    effective capabilities (to mount and change ids)."""
    for cap in range(_LAST_CAP + 1):
        _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "drop the bounding set")
    _clear_inheritable()
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0),
           "clear the ambient capabilities")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def become_run_user(request):
    """Step 3, in the PID 1 itself: the rest the tool inherits. Its real ids become
    the run's while its effective ids stay 0 (it keeps its capabilities to spawn);
    the tool is spawned with POSIX_SPAWN_RESETIDS, so its effective ids become the
    run's too, and exec makes the saved ids the same. With the capability sets
    `drop_capabilities` emptied and no_new_privs, exec gives the tool no capability."""
    os.chdir(request["cwd"])
    for kind, soft, hard in request["rlimits"]:
        resource.setrlimit(int(kind), (int(soft), int(hard)))
    os.setgroups([])
    uid, gid = int(request["uid"]), int(request["gid"])
    os.setresgid(gid, 0, 0)
    os.setresuid(uid, 0, 0)


def _clear_inheritable():
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.syscall(_SYS_CAPGET, header, data), "read the capabilities")
    data[2] = data[5] = 0  # inheritable, both words
    _check(_libc.syscall(_SYS_CAPSET, header, data), "clear the inheritable capabilities")


def _last_cap():
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as source:
            return int(source.read())
    except OSError:
        return 40


_LAST_CAP = _last_cap()
_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}))


def spawn_tool(argv, env):
    """Start the tool (vfork-like, no copy of this process) in a new session, every
    signal at its default (this is Python's process: SIGPIPE, SIGXFSZ ignored), its
    program searched on the request's PATH (os.execvpe would import a module, and
    the interpreter's library is not visible any more)."""
    program = argv[0]
    candidates = [program] if "/" in program else [
        os.path.join(folder or ".", program)
        for folder in env.get("PATH", "/usr/bin:/bin").split(":")]
    failure = FileNotFoundError(2, "No such file or directory")
    for candidate in candidates:
        try:  # a stat, not a spawn that fails (a clone, a failed exec and a reap)
            os.stat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError as error:
            failure = error
            continue
        try:
            return os.posix_spawn(candidate, argv, env, setsid=True, resetids=True,
                                  setsigdef=_SIGNALS, setsigmask=())
        except (FileNotFoundError, NotADirectoryError):
            pass
        except PermissionError as error:
            failure = error
    raise failure


def _fail(message, code=SETUP_FAILED):
    try:
        os.write(2, MESSAGE_PREFIX + message.encode("utf-8", "replace") + b"\n")
    finally:
        os._exit(code)


_SAMPLE_REQUEST = json.dumps({
    "id": 1, "argv": ["python3", "main.py"], "env": {"PATH": "/usr/bin", "HOME": "/tmp/r"},
    "cwd": "/tmp/r", "uid": 1, "gid": 1, "rlimits": [[9, 1, 1]],
    "mounts": [["tmpfs", "/tmp", 511, 1], ["dir", "/tmp/r", 511], ["tree", 0, "/tmp/r/a", 0]]})


def _warm_up(layout=()):
    """Go through the request's parsing and the report once ahead: this process is a
    copy of the launcher, and the first write to each page it shares (objects'
    reference counts, the heap) copies that page (~0.1 ms measured on a run's path).
    The sample carries this spare's `layout`, which its request repeats: as much to
    parse as the request."""
    sample = json.loads(_SAMPLE_REQUEST)
    sample["mounts"] = list(layout) + sample["mounts"]
    check_request(json.loads(json.dumps(sample)), system=False)
    json.dumps({"id": 1, "exit": 0, "rusage": list(resource.getrusage(resource.RUSAGE_SELF))})


def run_pid1(system, layout, root, inbox, channel):
    """Runs in the clone child, PID 1 of the new namespaces (see the module docstring):
    prepares the mounts every run shows, then waits on `inbox` for its run's request
    (end of file: it was not needed). It tells the executor how the tool ended on
    `channel` itself, before the namespace is torn down; the launcher's own report of
    this process's end follows (and is what the executor gets when this one was
    killed)."""
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "die with the launcher")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # so the tool cannot interrupt us
    made = []
    try:
        prepare_root(root, system)
        drop_capabilities()
        made = lay_out(layout)
        failure = None
    except Exception as error:  # noqa: BLE001 - reported to the run that comes
        failure = str(error) or type(error).__name__
    gc.disable()  # a short life: a collection would copy every page it touches
    _warm_up(layout)
    _schedule(os.SCHED_OTHER)  # ready: the request is on the run's path
    data, fds, _flags, _ = socket.recv_fds(inbox, MAX_MESSAGE, MAX_FDS)
    if not data or len(fds) < 3:
        _schedule(os.SCHED_BATCH)
        os._exit(0)
    try:
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds[:3]:
            if fd > 2:
                os.close(fd)
        try:
            request = json.loads(data)
            check_request(request, system=False)  # this PID 1 made its `system` ahead
        except ValueError as error:
            raise SetupError(f"malformed request: {error}") from None
        if failure is not None:
            raise SetupError(failure)
        enter_root(request["mounts"], fds[3:], made)
        for fd in fds[3:]:
            os.close(fd)
        become_run_user(request)
    except BaseException as error:  # noqa: BLE001 - any failure ends this run only
        _fail(str(error) or type(error).__name__)
    try:
        boosted = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, _tool_nice)  # the tool inherits the executor's
        tool = spawn_tool(request["argv"], request["env"])
    except OSError as error:
        _fail(f"cannot execute {request['argv'][0]}: {error.strerror}", 127)
    # root again (its effective ids never left 0): the tool can neither signal nor
    # trace its PID 1, and the PID 1 does not count against the run's process limit
    os.setresuid(0, 0, 0)
    os.setresgid(0, 0, 0)
    try:  # noqa: SIM105 - its exit report is on the run's path
        os.setpriority(os.PRIO_PROCESS, 0, boosted)
    except OSError:
        pass
    inbox.close()  # the launcher may prepare the next run now
    for fd in (0, 1, 2):
        os.close(fd)
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == tool:
            try:
                channel.send(json.dumps({"id": request["id"], "exit": status,
                                         "rusage": list(usage)}).encode())
                _schedule(os.SCHED_BATCH)  # the teardown preempts no tool
                # the executor first (it may share our real-time priority), then our
                # exit, which tears the namespaces down
                os.sched_yield()
                os._exit(REPORTED)
            finally:
                os._exit(_UNREPORTED_TOOL_EXIT)


# -- the launcher's loop ------------------------------------------------------------------

_REQUIRED = {"id": int, "argv": list, "env": dict, "cwd": str, "uid": int, "gid": int,
             "rlimits": list, "system": list, "mounts": list}


def check_request(request, steps=True, system=True):
    """The request's shape (its mount steps' too unless `steps` is false: the
    executor checked them when it built them); raises ValueError with what is wrong.
    Without `system` the request has no `system` part: what the executor sends a
    PID 1, which made that part ahead (see `run_message`)."""
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    for key, kind in _REQUIRED.items():
        if key == "system" and not system:
            continue
        if not isinstance(request.get(key), kind) or isinstance(request.get(key), bool):
            raise ValueError(f"{key!r} must be a {kind.__name__}")
    if not request["argv"] or not all(isinstance(a, str) and "\0" not in a
                                      for a in request["argv"]):
        raise ValueError("argv must be a non-empty list of strings without NUL")
    for name, value in request["env"].items():
        if not isinstance(value, str) or "\0" in name + value or "=" in name or not name:
            raise ValueError(f"environment variable {name!r} is not valid")
    if "\0" in request["cwd"] or not request["cwd"].startswith("/"):
        raise ValueError("cwd must be an absolute path")
    if request["uid"] <= 0 or request["gid"] <= 0:
        raise ValueError("a run never keeps uid or gid 0")
    for limit in request["rlimits"]:
        if not (isinstance(limit, list) and len(limit) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in limit)):
            raise ValueError("rlimits are [resource, soft, hard] integer triples")
    if steps:
        check_steps((request["system"] if system else []) + request["mounts"])


def run_message(request, mounts):
    """What the executor sends a PID 1 for `request`: the request with the run's own
    `mounts` (see `detached_trees`) and without its `system` part, which the PID 1,
    prepared for that part, made ahead."""
    message = {key: value for key, value in request.items() if key != "system"}
    message["mounts"] = mounts
    return json.dumps(message).encode()


def check_steps(steps):
    for op in steps:
        if not (isinstance(op, list) and op and all(isinstance(v, (str, int)) for v in op)):
            raise ValueError("a mount step is a non-empty list of strings and integers")


def system_key(system):
    """What tells two `system` parts apart (a prepared PID 1 serves only its own)."""
    return json.dumps(system, separators=(",", ":"))


class Launcher:
    """Clones each run's PID 1 ahead and hands it, with a pidfd of it and its inbox,
    to the executor, which sends the run's request to that PID 1 itself. Spare
    PID 1s (for the `system` part the executor last asked for; as many as it last
    asked for, one unless runs go side by side, at most MAX_SPARES) are handed out
    unasked and replaced once used; `prepare` asks for one now (a different
    `system`, or no spare left). Reaps every PID 1 and reports its end."""

    def __init__(self, channel, root):
        self.channel = channel
        self.root = root
        self.runs = {}  # pid -> pidfd of every PID 1 alive
        self.inboxes = {}  # fd -> the inbox of a PID 1 handed out, until its end of file
        self.spares = set()  # the fds of the inboxes of the spares handed out unasked
        self.wanted = 1  # how many spares to keep out
        self.next_system = None
        self.next_layout = []
        self.network_used = True
        self.poll = select.poll()
        self.poll.register(channel.fileno(), select.POLLIN)

    def send(self, message, fds=()):
        data = json.dumps(message).encode()
        if fds:
            socket.send_fds(self.channel, [data], list(fds))
        else:
            self.channel.send(data)

    def serve(self):
        """Answer messages and inbox ends first; spares are cloned one at a time in
        between, so a `prepare` never queues behind a run of spares."""
        while True:
            for fd, _events in self.poll.poll(0 if self.short() else -1):
                if fd == self.channel.fileno():
                    if not self.receive():
                        return
                elif fd in self.inboxes:
                    self.used(fd)
                else:
                    self.reap(fd)
            if self.short():
                self.replenish(one=True)

    def receive(self):
        try:
            data, fds, flags, _ = socket.recv_fds(self.channel, MAX_MESSAGE, MAX_FDS)
        except InterruptedError:
            return True
        except OSError:  # the executor is gone
            return False
        for fd in fds:  # the executor sends none
            os.close(fd)
        if not data:
            return False
        self.handle(data, flags)
        return True

    def handle(self, data, flags):
        """A `prepare` message: {"prepare": its id, "system": the mounts every run
        shows, "spares": how many to keep out from now on (optional, 1 to MAX_SPARES),
        "layout": the run's tmpfs and folders to make ahead (optional, `layout_of`)};
        or {"spares": n} and/or {"layout": [steps]} alone: fewer (or more) spares, or
        another layout, from now on, none cloned now (the executor drops the surplus
        it holds; a spare of the old layout detaches it when its request comes)."""
        prepare_id = None
        try:
            message = json.loads(data)
            prepare_id = message.get("prepare") if isinstance(message, dict) else None
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ValueError("the message was truncated")
            settings_only = isinstance(message, dict) and bool(message) \
                and set(message) <= {"spares", "layout"}
            if not settings_only and (not isinstance(prepare_id, int)
                                      or not isinstance(message.get("system"), list)):
                raise ValueError("a message is {\"prepare\": id, \"system\": [steps]}")
            spares = message.get("spares", max(1, self.wanted))
            if not isinstance(spares, int) or isinstance(spares, bool) \
                    or not 1 <= spares <= MAX_SPARES:
                raise ValueError(f"spares must be an integer from 1 to {MAX_SPARES}")
            layout = message.get("layout", self.next_layout)
            if not isinstance(layout, list):
                raise ValueError("a layout is a list of mount steps")
            check_steps(layout)
            if layout_of(layout) != layout:
                raise ValueError("a layout is a tmpfs and folders inside it")
            if not settings_only:
                check_steps(message["system"])
        except ValueError as error:
            self.send({"id": prepare_id, "error": f"malformed request: {error}", "code": "E3405"})
            return
        if "spares" in message or not settings_only:
            self.wanted = spares
        self.next_layout = layout
        if not settings_only:
            self.next_system = message["system"]
            self.hand_out(message["system"], prepare_id)

    def hand_out(self, system, prepare_id):
        """Clone a PID 1 for `system` and hand it to the executor: `prepared` with a
        pidfd of it and its inbox (`id` None: the spare)."""
        prepared = self.clone(system, self.next_layout)
        if prepared is None:
            self.send({"id": prepare_id, "error": "clone failed: "
                       + os.strerror(ctypes.get_errno()), "code": "E3405"})
            return False
        pid, pidfd, inbox = prepared
        self.inboxes[inbox.fileno()] = inbox
        self.poll.register(inbox.fileno(), select.POLLIN)
        if prepare_id is None:
            self.spares.add(inbox.fileno())
        self.send({"id": prepare_id, "prepared": pid, "system": system_key(system)},
                  [pidfd, inbox.fileno()])
        return True

    def used(self, fd):
        """End of file on an inbox: its PID 1 spawned its tool (or failed, or was not
        wanted). Its replacement is prepared now (`serve`), not while that run was
        being set up (its mounts and namespaces would compete for the same kernel
        locks and cores)."""
        self.poll.unregister(fd)
        self.inboxes.pop(fd).close()
        self.spares.discard(fd)

    def short(self):
        """Whether fewer spares are out than wanted (or the next network namespace is
        still to be made)."""
        return (self.next_system is not None and len(self.spares) < self.wanted) \
            or self.network_used

    def replenish(self, one=False):
        """Hand out spare PID 1s until as many as wanted are out (one at most with
        `one`), then make the next network namespace."""
        while len(self.spares) < self.wanted and self.next_system is not None:
            if not self.hand_out(self.next_system, None):
                self.wanted = len(self.spares)  # clone failed: until asked again
                break
            if one:
                return
        if self.network_used:
            fresh_network()
            self.network_used = False

    def clone(self, system, layout=()):
        """A new PID 1 in new namespaces, the network namespace this process sits in
        included: (pid, pidfd, our end of its inbox), or None."""
        if self.network_used:
            fresh_network()
        inbox, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end, option in ((inbox, _SO_SNDBUFFORCE), (theirs, _SO_RCVBUFFORCE)):
            try:  # noqa: SIM105 - a request may be as large as MAX_MESSAGE
                end.setsockopt(socket.SOL_SOCKET, option, MAX_MESSAGE)
            except OSError:
                pass
        pid = _clone_libc.syscall(_SYS_CLONE, ctypes.c_ulong(CLONE_FLAGS), None, None, None,
                                  None)
        if pid == 0:
            try:
                _close_all_but(0, 1, 2, self.channel.fileno(), theirs.fileno())
                run_pid1(system, list(layout), self.root, theirs, self.channel)
            finally:
                os._exit(SETUP_FAILED)
        theirs.close()
        if pid < 0:
            inbox.close()
            return None
        self.network_used = True
        pidfd = os.pidfd_open(pid)
        self.runs[pid] = pidfd
        self.poll.register(pidfd, select.POLLIN)
        return pid, pidfd, inbox

    def reap(self, pidfd):
        for pid, fd in list(self.runs.items()):
            if fd != pidfd:
                continue
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done == 0:
                return
            self.poll.unregister(fd)
            os.close(fd)
            del self.runs[pid]
            if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == REPORTED):
                self.send({"pid": pid, "exit": status, "rusage": list(usage)})
            return

    def kill_all(self):
        for pidfd in self.runs.values():
            try:  # noqa: SIM105
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass


def _close_all_but(*keep):
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:  # noqa: SIM105 - the listing's own fd is gone already
                os.close(int(name))
            except OSError:
                pass


def boost():
    """Raise this process's CPU weight by LAUNCHER_NICE (best effort: without
    CAP_SYS_NICE it stays), remembering the executor's nice value for the tools;
    under the normal policy, make it a batch one (`_batched`)."""
    global _tool_nice, _batched
    _tool_nice = os.getpriority(os.PRIO_PROCESS, 0)
    try:  # noqa: SIM105
        os.setpriority(os.PRIO_PROCESS, 0, max(-20, _tool_nice + LAUNCHER_NICE))
    except OSError:
        pass
    if os.sched_getscheduler(0) == os.SCHED_OTHER:  # a real-time executor's stays
        _batched = True
        _schedule(os.SCHED_BATCH)


def _schedule(policy):
    """Switch between SCHED_OTHER and SCHED_BATCH (the nice value stays) when this
    launcher is `_batched`; best effort."""
    if _batched:
        try:  # noqa: SIM105
            os.sched_setscheduler(0, policy, os.sched_param(0))
        except OSError:
            pass


def probe():
    """Exit 0 when this kernel lets us clone into the namespaces a run gets."""
    pid = _clone_libc.syscall(_SYS_CLONE, ctypes.c_ulong(CLONE_FLAGS), None, None, None, None)
    if pid == 0:
        os._exit(0)
    if pid < 0:
        os._exit(1)
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


def main(argv):
    if argv[1:] == ["--probe"]:
        probe()
    channel_fd, parent = int(argv[1]), int(argv[2])
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "die with the executor")
    if os.getppid() != parent:
        os._exit(0)
    os.set_inheritable(channel_fd, False)  # never into a tool's exec
    channel = socket.socket(fileno=channel_fd)
    boost()
    root = argv[3]
    launcher = Launcher(channel, root)
    launcher.replenish()
    launcher.send({"ready": os.getpid(),
                   "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    try:
        launcher.serve()
    except OSError:  # an answer the executor can no longer read: it is gone
        pass
    finally:
        launcher.kill_all()


if __name__ == "__main__":
    main(sys.argv)
