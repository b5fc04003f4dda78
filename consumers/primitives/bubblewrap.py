"""The bubblewrap (`bwrap`) sandbox of the subprocess primitive: the argv prefix.

What the tool sees: `/usr` read-only (with the merged-usr symlinks `/bin`, `/lib`,
`/lib64`, `/sbin`), a handful of harmless `/etc` entries (dynamic linker cache, TLS
roots, resolver and name-service files, passwd/group; never shadow), the install
prefix of its interpreter when that lives outside `/usr` (see `install_prefixes`:
never `/`, a top-level folder, a pseudo-filesystem, nor the state directory, one of
its ancestors or anything inside it), fresh `/proc` and `/dev`, and its run
directory at the same path as on the host.

`/etc` is one bind of a prepared view when the caller gives one (sandbox_cache.EtcView:
copies of the files, the folders bound on mount points), else one bind per entry.

The run directory is a tmpfs of the run's disk quota (`--size`), writable by the
tool, holding the tool's files bound read-only from the host folder they were
materialised in (a tree shared by runs, sandbox_cache.ToolTrees, or a host run
directory); `/tmp` is that same
tmpfs (a symlink to the run directory, or, when the run directory lives under
`/tmp`, the tmpfs mounted on `/tmp` with the run directory inside it), so everything
a run writes counts against one quota and nothing reaches the host's disk (measured:
a 20 MiB quota stops a writer at 20 MiB with ENOSPC, as root and as an ordinary user).

Every namespace is unshared, the network always: a tool whose network policy allows
hosts reaches them only through the egress relay and proxy (egress_relay,
egress_proxy), never the host's network. Own PID namespace, a new session, all
capabilities dropped, `--die-with-parent` so killing the `bwrap` process (our
process-group leader) tears the sandbox down and every process in it.

As root, bwrap runs privileged (no user namespace) and execs the tool through
`setpriv` as the run's own uid (leased from the operator's range, see sandbox_uids)
with no_new_privs and empty capability sets: RLIMIT_NPROC, set outside by prlimit,
then counts this run's processes only. Unprivileged callers use `--unshare-user --uid
65534 --cap-drop ALL`; there the process limit is set *inside* the sandbox (a
`prlimit --nproc` in front of the tool), because the kernel counts a user
namespace's processes per namespace below the limit its creator had: set outside,
every run would share the caller's count (measured: a run holding 29 of 30
processes makes the next run's bwrap fail to start; set inside, the other run forks
freely).
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from domain.model import NetworkPolicy

SANDBOX_UID = 65534
SANDBOX_GID = 65534
_SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"
SYSTEM_ETC_ENTRIES: tuple[str, ...] = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
    "ca-certificates.conf", "pki", "resolv.conf", "hosts", "nsswitch.conf", "host.conf",
    "gai.conf", "localtime", "passwd", "group", "mime.types",
)
_MERGED_USR = (("usr/bin", "/bin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64"),
               ("usr/sbin", "/sbin"))
_NOT_MADE: tuple[Path, ...] = (Path("/"), Path("/tmp"))
"""Folders a sandbox's fresh root has already (its root, and /tmp, its tmpfs)."""
PSEUDO_FILESYSTEMS: tuple[Path, ...] = (Path("/proc"), Path("/sys"), Path("/dev"),
                                        Path("/run"))


@dataclass(frozen=True)
class Confinement:
    """What the operator's policy decides for one run under bubblewrap.

    `uid`: the run's own uid as root (None: SANDBOX_UID in a user namespace);
    `disk_bytes`: size of the run's tmpfs; `inner_max_processes`: the process limit
    to set inside the sandbox (unprivileged runs, see the module docstring);
    `relay`: the argv prefix of the egress relay (None: no network at all);
    `extra_read_only`: more host paths to show read-only (the relay's interpreter);
    `files`: the host folder holding the tool's files, laid out as in the run
    directory (None: the run directory itself is that folder on the host);
    `etc_view`: a prepared folder to show as `/etc` in one mount, with `etc_binds`
    (entries of /etc) bound on their mount points in it (see sandbox_cache.EtcView;
    None: each of SYSTEM_ETC_ENTRIES bound on its own);
    `run_binds`: host files (host, inside) bound into the run directory, the first
    read-write and the others read-only (the report protocol's files)."""

    uid: int | None = None
    disk_bytes: int = 1024 * 1024 * 1024
    inner_max_processes: int | None = None
    relay: tuple[str, ...] | None = None
    extra_read_only: tuple[Path, ...] = ()
    protected: tuple[Path, ...] = field(default_factory=tuple)
    files: Path | None = None
    etc_view: Path | None = None
    etc_binds: tuple[str, ...] = ()
    run_binds: tuple[tuple[Path, Path], ...] = ()


MountStep = tuple[str | int, ...]
"""One step of a sandbox's mount plan, inside its fresh root: ("ro_bind" | "bind" |
"ro_bind_try", host path, path inside), ("symlink", target, link), ("dir", path,
mode), ("tmpfs", path, mode, size in bytes), ("proc", path), ("dev", path)."""


class UnsafeMount(OSError):
    """A path the sandbox will not show a tool (the run fails with E3405)."""


@functools.cache
def bwrap_binary() -> str | None:
    """Path of `bwrap`, or None when bubblewrap is not installed."""
    return shutil.which("bwrap", path=_SYSTEM_PATH)


@functools.cache
def setpriv_binary() -> str | None:
    return shutil.which("setpriv", path=_SYSTEM_PATH)


@functools.cache
def prlimit_binary() -> str | None:
    return shutil.which("prlimit", path=_SYSTEM_PATH)


def network_allowed(policy: NetworkPolicy) -> bool:
    """A tool may reach some hosts (through the egress proxy) only when its policy
    names allowed domains and does not deny all egress."""
    return bool(policy.allowed_domains) and not policy.deny_all_egress


def mount_plan(workdir: Path, cwd: Path, program: str, path: str,
               confinement: Confinement) -> list[MountStep]:
    """What the sandbox's fresh root holds, in order (see MountStep); the same plan
    for bubblewrap and for the namespace launcher (launcher_program). Raises
    UnsafeMount when a path to show is not safe to show."""
    return [*system_mounts(confinement),
            *run_mounts(workdir, cwd, program, path, confinement)]


def system_mounts(confinement: Confinement,
                  links: tuple[bool, ...] | None = None) -> list[MountStep]:
    """The part of the plan every run shows alike: /usr, its links, /etc, /proc, /dev.
    `links`: which merged-usr links are symlinks (looked at now when None)."""
    links = merged_usr_links() if links is None else links
    return list(_system_mounts(links, confinement.etc_view, confinement.etc_binds))


MERGED_USR_LINKS = tuple(link for _target, link in _MERGED_USR)


def merged_usr_links() -> tuple[bool, ...]:
    """Which of the merged-usr links (/bin, /lib, /lib64, /sbin) are symlinks here."""
    return tuple(os.path.islink(link) for link in MERGED_USR_LINKS)


@functools.lru_cache(maxsize=16)
def _system_mounts(links: tuple[bool, ...], etc_view: Path | None,
                   etc_binds: tuple[str, ...]) -> tuple[MountStep, ...]:
    """`system_mounts` from all it depends on: which merged-usr links are symlinks on
    the host, the /etc view and what is bound on its mount points."""
    steps: list[MountStep] = [("ro_bind", "/usr", "/usr")]
    for (target, link), is_link in zip(_MERGED_USR, links, strict=True):
        steps.append(("symlink", target, link) if is_link else ("ro_bind_try", link, link))
    if etc_view is None:
        steps += [("ro_bind_try", f"/etc/{entry}", f"/etc/{entry}")
                  for entry in SYSTEM_ETC_ENTRIES]
    else:
        steps.append(("ro_bind", str(etc_view), "/etc"))
        steps += [("ro_bind_try", f"/etc/{entry}", f"/etc/{entry}") for entry in etc_binds]
    return (*steps, ("proc", "/proc"), ("dev", "/dev"))


def run_mounts(workdir: Path, cwd: Path, program: str, path: str,
               confinement: Confinement, *, prefixes: bool = True) -> list[MountStep]:
    """The run's own part of the plan: its run directory, files, the run's binds and
    (unless `prefixes` is False) install prefixes (`prefix_mounts`)."""
    steps = _run_directory(workdir, confinement.disk_bytes, confinement.files or workdir, cwd)
    steps += run_bind_mounts(workdir, confinement.run_binds)
    if prefixes:
        steps += prefix_mounts(program, path, cwd, confinement)
    return steps


def prefix_mounts(program: str, path: str, cwd: Path,
                  confinement: Confinement) -> list[MountStep]:
    """The install prefixes of `program` (and `extra_read_only`), read-only, with
    their parents made traversable."""
    shown = [*install_prefixes(program, path, cwd, protected=confinement.protected),
             *confinement.extra_read_only]
    steps: list[MountStep] = []
    for prefix in dict.fromkeys(shown):
        steps += [*_traversable_parents(prefix), ("ro_bind", str(prefix), str(prefix))]
    return steps


def bwrap_arguments(steps: list[MountStep]) -> list[str]:
    """The bwrap options that make the mount plan `steps`."""
    args: list[str] = []
    for step in steps:
        kind = step[0]
        if kind == "dir":
            args += ["--perms", f"{step[2]:04o}", "--dir", str(step[1])]
        elif kind == "tmpfs":
            args += ["--perms", f"{step[2]:04o}", "--size", str(step[3]), "--tmpfs", str(step[1])]
        elif kind in ("proc", "dev"):
            args += [f"--{kind}", str(step[1])]
        else:
            args += [_BWRAP_BINDS[kind], str(step[1]), str(step[2])]
    return args


_BWRAP_BINDS = {"ro_bind": "--ro-bind", "ro_bind_try": "--ro-bind-try", "bind": "--bind",
                "symlink": "--symlink"}


def bwrap_prefix(workdir: Path, cwd: Path, program: str, path: str,
                 confinement: Confinement | None = None) -> list[str]:
    """The argv that runs `program` (and its arguments, appended by the caller) inside
    the sandbox. Raises FileNotFoundError when bwrap (or setpriv, as root) is missing,
    UnsafeMount when a path to show is not safe to show."""
    confinement = confinement or Confinement()
    bwrap = bwrap_binary()
    if bwrap is None:
        raise FileNotFoundError("bwrap")
    args = [bwrap, *bwrap_arguments(mount_plan(workdir, cwd, program, path, confinement))]
    # the sandbox's own root (a tmpfs holding the mount points) is writable by the tool
    # in a user namespace: read-only, so nothing is written outside the quota
    args += ["--remount-ro", "/"]
    args += ["--chdir", str(cwd),
             "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--unshare-net", "--die-with-parent", "--new-session"]
    inside = _inside(confinement)
    if os.geteuid() != 0:
        return [*args, "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
                "--cap-drop", "ALL", "--", *inside]
    setpriv = setpriv_binary()
    if setpriv is None or not setpriv.startswith("/usr/"):
        raise FileNotFoundError("setpriv (util-linux, under /usr)")
    uid = SANDBOX_UID if confinement.uid is None else confinement.uid
    gid = SANDBOX_GID if confinement.uid is None else confinement.uid
    # bwrap runs privileged (as root, no user namespace) and setpriv, inside, becomes
    # the run's unprivileged uid: that change of uid clears every capability, and the
    # bounding and inheritable sets are emptied so none can come back.
    return [*args, "--", setpriv, f"--reuid={uid}", f"--regid={gid}",
            "--clear-groups", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all",
            "--", *inside]


def _inside(confinement: Confinement) -> list[str]:
    """What runs inside the sandbox in front of the tool: the process limit (when it
    must be set inside) and the egress relay."""
    inside: list[str] = []
    if confinement.inner_max_processes is not None:
        prlimit = prlimit_binary()
        if prlimit is None or not prlimit.startswith("/usr/"):
            raise FileNotFoundError("prlimit (util-linux, under /usr)")
        limit = confinement.inner_max_processes
        inside += [prlimit, f"--nproc={limit}:{limit}", "--"]
    if confinement.relay is not None:
        inside += list(confinement.relay)
    return inside


def _run_directory(workdir: Path, size: int, files: Path, cwd: Path) -> list[MountStep]:
    """One tmpfs of `size` bytes holds the run directory and /tmp; the tool's files
    (materialised in the host folder `files`) are bound into it read-only, and its
    working directory `cwd` is made in it."""
    steps: list[MountStep] = []
    if workdir.is_relative_to("/tmp"):
        steps.append(("tmpfs", "/tmp", 0o1777, size))
        steps += [("dir", str(parent), 0o711) for parent in reversed(workdir.parents)
                  if parent not in _NOT_MADE]
        steps.append(("dir", str(workdir), 0o777))
    else:
        steps += _traversable_parents(workdir)
        steps += [("tmpfs", str(workdir), 0o777, size), ("symlink", str(workdir), "/tmp")]
    folders, names = (_layout(str(files)) if files != workdir
                      else _layout.__wrapped__(str(files)))
    inside, source = str(workdir), str(files)
    steps += [("dir", f"{inside}/{folder}", 0o777) for folder in folders]
    steps += [("ro_bind", f"{source}/{name}", f"{inside}/{name}") for name in names]
    made = set(folders)
    for depth in range(1, len(cwd_parts := cwd.relative_to(workdir).parts) + 1):
        folder = "/".join(cwd_parts[:depth])
        if folder not in made:
            made.add(folder)
            steps.append(("dir", f"{inside}/{folder}", 0o777))
    return steps


def run_bind_mounts(workdir: Path,
                    binds: tuple[tuple[Path, Path], ...]) -> list[MountStep]:
    """Host files bound into the run directory, the first read-write, the others
    read-only; their folders made searchable and not writable by the tool (bwrap
    would make them 0700, closed to the tool's uid)."""
    steps: list[MountStep] = []
    made: set[Path] = set()
    for index, (host, inside) in enumerate(binds):
        for folder in reversed(inside.parents):
            if folder.is_relative_to(workdir) and folder != workdir and folder not in made:
                made.add(folder)
                steps.append(("dir", str(folder), 0o755))
        steps.append(("bind" if index == 0 else "ro_bind", str(host), str(inside)))
    return steps


@functools.lru_cache(maxsize=256)
def _layout(files: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(folders, files) under `files`, relative, parents first. Cached for shared
    trees, which never change (a changed tree is made again under a new name)."""
    folders: list[str] = []
    names: list[str] = []
    for folder, subfolders, found in os.walk(files):
        relative = os.path.relpath(folder, files)
        prefix = "" if relative == "." else relative + "/"
        folders.extend(prefix + name for name in sorted(subfolders))
        names.extend(prefix + name for name in sorted(found))
    return tuple(folders), tuple(names)


def _traversable_parents(target: Path) -> list[MountStep]:
    """Folders leading to a bind target, made searchable (0711) inside the sandbox:
    bwrap copies the host folders' modes, and a 0700 ancestor (pytest's tmp dirs,
    /root) would lock the sandbox uid out. Nothing on the host changes."""
    return [("dir", str(parent), 0o711) for parent in reversed(target.parents)
            if parent not in _NOT_MADE]


def install_prefixes(program: str, path: str, cwd: Path, *,
                     protected: tuple[Path, ...] = ()) -> list[Path]:
    """The install prefixes (parent of `bin/`) of the program, when outside /usr and
    outside the run directory: e.g. /opt/node for /opt/node/bin/node. An absolute
    program path gives its own prefix as written too (its folder's symlinks resolved),
    so a virtual environment's interpreter (`/srv/app/.venv/bin/python`, a link to the
    real one) brings its packages along with the interpreter it links to.
    Raises UnsafeMount for a prefix that must never be shown (see `check_shown`)."""
    if program.startswith("/"):
        found: str | None = program if Path(program).exists() else None
    elif "/" in program:
        return []
    else:
        found = shutil.which(program, path=path)
    if found is None:
        return []
    candidates = [Path(found).resolve()]
    if program.startswith("/"):
        written = Path(program)
        candidates.insert(0, written.parent.resolve() / written.name)
    prefixes: list[Path] = []
    for candidate in candidates:
        if candidate.is_relative_to("/usr") or candidate.is_relative_to(cwd):
            continue
        prefix = candidate.parent.parent if candidate.parent.name == "bin" else candidate.parent
        check_shown(prefix, protected)
        if prefix not in prefixes:
            prefixes.append(prefix)
    return prefixes


def check_shown(prefix: Path, protected: tuple[Path, ...] = ()) -> None:
    """Refuse (UnsafeMount) a folder that would show the tool the host: `/`, a
    top-level folder (`/opt`, `/home`, `/etc`...), a pseudo-filesystem (/proc, /sys,
    /dev, /run) or anything in one, or a protected folder (the state directory), an
    ancestor of one, or anything inside one."""
    real = Path(os.path.realpath(prefix))
    for shown in {prefix, real}:
        if len(shown.parts) < 3:
            raise UnsafeMount(f"the sandbox will not show {shown}: a top-level folder of the "
                              "host")
        if any(shown.is_relative_to(p) for p in PSEUDO_FILESYSTEMS):
            raise UnsafeMount(f"the sandbox will not show {shown}: a host pseudo-filesystem")
        for folder in protected:
            if shown.is_relative_to(folder) or folder.is_relative_to(shown):
                raise UnsafeMount(f"the sandbox will not show {shown}: it holds or is inside "
                                  f"the state directory {folder}")
