"""The bubblewrap (`bwrap`) sandbox of the subprocess primitive: the argv prefix.

What the tool sees: `/usr` read-only (with the merged-usr symlinks `/bin`, `/lib`,
`/lib64`, `/sbin`), a handful of harmless `/etc` entries (dynamic linker cache, TLS
roots, resolver and name-service files, passwd/group; never shadow), the install
prefix of its interpreter when that lives outside `/usr`, fresh `/proc` and `/dev`,
a private tmpfs `/tmp`, and its own run directory bound read-write at the same path
(HOME = TMPDIR = cwd as without the sandbox). Every namespace is unshared (network
too, unless the plan's network policy names allowed domains), with its own PID
namespace, a new session, all capabilities dropped, and `--die-with-parent` so
killing the `bwrap` process (our process-group leader) tears the sandbox down.

As root, bwrap runs privileged (no user namespace) and execs the tool through
`setpriv` as uid/gid 65534 (nobody) with no_new_privs and empty capability sets. The
tool's processes then really belong to an unprivileged uid: with `--unshare-user
--uid 65534` instead, the sandbox uid maps back to root and the kernel ignores
RLIMIT_NPROC (measured: a fork bomb under `prlimit --nproc=30` forks 200 times that
way and stops at 29 this way). Unprivileged callers use `--unshare-user --uid 65534
--cap-drop ALL`. The run directory's folders are handed to that uid; the tool's
files stay hard links to root-owned read-only store objects.
"""

from __future__ import annotations

import functools
import os
import shutil
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


@functools.cache
def bwrap_binary() -> str | None:
    """Path of `bwrap`, or None when bubblewrap is not installed."""
    return shutil.which("bwrap", path=_SYSTEM_PATH)


@functools.cache
def setpriv_binary() -> str | None:
    return shutil.which("setpriv", path=_SYSTEM_PATH)


def network_allowed(policy: NetworkPolicy) -> bool:
    """A subprocess gets the host network only when its policy names allowed domains
    (bwrap cannot filter by domain: allowed means the whole network)."""
    return bool(policy.allowed_domains) and not policy.deny_all_egress


def bwrap_prefix(workdir: Path, cwd: Path, program: str, path: str, *,
                 share_net: bool) -> list[str]:
    """The argv that runs `program` (and its arguments, appended by the caller) inside
    the sandbox. Raises FileNotFoundError when bwrap (or setpriv, as root) is missing."""
    bwrap = bwrap_binary()
    if bwrap is None:
        raise FileNotFoundError("bwrap")
    args = [bwrap, "--ro-bind", "/usr", "/usr"]
    for target, link in _MERGED_USR:
        args += ["--symlink", target, link] if Path(link).is_symlink() \
            else ["--ro-bind-try", link, link]
    for entry in SYSTEM_ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for prefix in install_prefixes(program, path, cwd):
        args += [*_traversable_parents(prefix), "--ro-bind", str(prefix), str(prefix)]
    args += [*_traversable_parents(workdir), "--bind", str(workdir), str(workdir),
             "--chdir", str(cwd),
             "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session"]
    if not share_net:
        args.append("--unshare-net")
    if os.geteuid() != 0:
        return [*args, "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
                "--cap-drop", "ALL", "--"]
    setpriv = setpriv_binary()
    if setpriv is None or not setpriv.startswith("/usr/"):
        raise FileNotFoundError("setpriv (util-linux, under /usr)")
    # bwrap runs privileged (as root, no user namespace) and setpriv, inside, becomes
    # the unprivileged uid: that change of uid clears every capability, and the
    # bounding and inheritable sets are emptied so none can come back.
    return [*args, "--", setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}",
            "--clear-groups", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all",
            "--"]


def _traversable_parents(target: Path) -> list[str]:
    """Folders leading to a bind target, made searchable (0711) inside the sandbox:
    bwrap copies the host folders' modes, and a 0700 ancestor (pytest's tmp dirs,
    /root) would lock the sandbox uid out. Nothing on the host changes."""
    args: list[str] = []
    for parent in reversed(target.parents):
        if parent == Path("/") or parent == Path("/tmp"):
            continue
        args += ["--perms", "0711", "--dir", str(parent)]
    return args


def hand_over(workdir: Path) -> None:
    """Make the run directory's folders writable by the sandbox uid (as root only)."""
    if os.geteuid() != 0:
        return
    for folder, _, _ in os.walk(workdir):
        os.chown(folder, SANDBOX_UID, SANDBOX_GID)


def install_prefixes(program: str, path: str, cwd: Path) -> list[Path]:
    """The install prefixes (parent of `bin/`) of the program, when outside /usr and
    outside the run directory: e.g. /opt/node for /opt/node/bin/node. An absolute
    program path gives its own prefix as written too, so a virtual environment's
    interpreter (`/srv/app/.venv/bin/python`, a link to the real one) brings its
    packages along with the interpreter it links to."""
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
        candidates.insert(0, Path(program))
    prefixes: list[Path] = []
    for candidate in candidates:
        if candidate.is_relative_to("/usr") or candidate.is_relative_to(cwd):
            continue
        prefix = candidate.parent.parent if candidate.parent.name == "bin" else candidate.parent
        if prefix not in prefixes:
            prefixes.append(prefix)
    return prefixes
