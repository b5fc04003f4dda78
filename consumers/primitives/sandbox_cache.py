"""What bubblewrap runs share instead of preparing it again for every run.

Measured on the reference machine (2 cores, bubblewrap 0.8): binding the 15 `/etc`
entries a sandbox shows one by one costs bwrap ~1.5 ms of CPU per run, and making,
filling and removing a host run directory on ext4 ~2 ms. So, per executor process:

- `EtcView`: a folder holding a copy of each `/etc` file a sandbox may see
  (`bubblewrap.SYSTEM_ETC_ENTRIES`) and an empty mount point for each `/etc` folder
  among them (and for a file it cannot read), bound read-only as the sandbox's `/etc`
  in one mount; the folders (and unreadable files) are then bound on their mount
  points as before. Before each run every entry is `stat`ed, following symlinks as a
  bind does, and one that changed, appeared or vanished is copied, added or removed,
  so a run sees what `/etc` holds when it starts.
- `ToolTrees`: each distinct set of tool files materialised once (hard links to the
  content store's read-only objects) and bound read-only, file by file, into every
  run's own tmpfs, so a run makes no folder on the host. Before each run the store
  checks paths and bytes exactly as when materialising (`ContentStore.sources`), and
  each file of the tree must still be the very file made from the verified object
  (same inode, size, times): otherwise the tree is made again. When only its change
  time moved (a run in a host folder linked or unlinked the same store object), its
  bytes are hashed again instead, and the tree is kept when they are still the
  verified ones.

Both make their checks once and then skip them while a `HostWatch` (host_watch) has
seen no change to any path they relied on: the `/etc` entries with every link and
folder on their way, a tree's files, its folders and the store's objects and their
folders. Any change there, or a path that cannot be watched, means the full checks
before the next run, as above.

Both live in one private folder of this process (`mkdtemp`, mode 0700, named after
its pid) that is removed at exit, or by the next executor when this one was killed.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.primitives.file_store import ContentStore, file_sha256
from consumers.primitives.host_watch import Dependency, HostWatch, Token, WatchedAnswers
from consumers.primitives.run_request import RequestCache
from domain.model import ToolFile

_KEEP_TREES = 64
TreeKey = tuple[tuple[str, str, bool], ...]
"""A tool tree's files: (path, sha256, executable) each."""
FileSignature = tuple[int, int, int, int, int]


def _signature(info: os.stat_result) -> FileSignature:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode)


class EtcView:
    """A folder standing for the sandbox's `/etc` (see the module docstring)."""

    def __init__(self, path: Path, entries: Sequence[str], source: Path = Path("/etc"),
                 watch: HostWatch | None = None) -> None:
        self.path = path
        self._source = source
        self._entries = tuple(entries)
        self._sources = tuple((name, os.path.join(source, name)) for name in self._entries)
        self._seen: dict[str, tuple[FileSignature, bool] | None] = {}
        self._watch = HostWatch() if watch is None else watch
        self._checked: Token | None = None
        self._binds: tuple[str, ...] = ()
        path.mkdir(mode=0o755)
        os.chmod(path, 0o755)

    def refresh(self) -> tuple[str, ...]:
        """Bring the view in step with `/etc`; the entries to bind on their mount
        points (folders, and files this process cannot read)."""
        renewed = self._watch.renewed(self._checked)
        if renewed is not None:
            self._checked = renewed
            return self._binds
        self._checked = None
        moment = self._watch.moment(self._watch.watch(
            [source for _, source in self._sources], ancestors=True))
        for name, source in self._sources:
            try:
                info: os.stat_result | None = os.stat(source)
            except OSError:
                info = None
            known = self._seen.get(name, ...)
            if info is None:
                if known is not None:
                    self._remove(name)
                    self._seen[name] = None
                continue
            if known is ... or known is None or known[0] != _signature(info):
                self._seen[name] = (_signature(info), self._update(name, info))
        self._binds = tuple(name for name in self._entries
                            if (seen := self._seen.get(name)) is not None and seen[1])
        self._checked = moment  # the watch began before this check: a change ends it
        return self._binds

    def _update(self, name: str, info: os.stat_result) -> bool:
        """Copy or make the mount point of one entry; True when it must be bound."""
        self._remove(name)
        target = self.path / name
        if stat.S_ISDIR(info.st_mode):
            target.mkdir()
            os.chmod(target, stat.S_IMODE(info.st_mode))
            return True
        temporary = self.path / f".{name}.new"
        try:
            shutil.copyfile(self._source / name, temporary)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()
            target.touch(mode=0o444)
            return True
        os.chmod(temporary, stat.S_IMODE(info.st_mode))
        if os.geteuid() == 0:
            os.chown(temporary, info.st_uid, info.st_gid)
        os.replace(temporary, target)
        return False

    def _remove(self, name: str) -> None:
        target = self.path / name
        with contextlib.suppress(FileNotFoundError):
            if target.is_dir() and not target.is_symlink():
                target.rmdir()
            else:
                target.unlink()


@dataclass
class _Tree:
    """One materialised file set: (parts, store object, signature, hard-linked) per file."""

    path: Path
    files: list[tuple[tuple[str, ...], Path, FileSignature, bool]]
    leases: int = 0
    checked: Token | None = None
    """The HostWatch moment its files were last checked at (None: check them)."""


@dataclass
class ToolTrees:
    """Materialised tool files shared by runs (see the module docstring)."""

    root: Path
    keep: int = _KEEP_TREES
    watch: HostWatch = field(default_factory=HostWatch)
    _trees: OrderedDict[TreeKey, _Tree] = field(default_factory=OrderedDict)
    _retiring: list[_Tree] = field(default_factory=list)
    _made: int = 0

    def lease(self, store: ContentStore, files: Sequence[ToolFile]) -> Path:
        """The folder holding `files`, verified; give it back with `release`.
        Raises what `ContentStore.materialise` raises for a bad file."""
        key = tuple((f.path, f.sha256, f.is_executable) for f in files)
        tree = self._trees.get(key)
        renewed = None if tree is None else self.watch.renewed(tree.checked)
        if renewed is not None:
            assert tree is not None
            tree.checked = renewed
            store.check_inline(files)
        else:
            tree = self._checked(key, tree, store, files)
        self._trees.move_to_end(key)
        tree.leases += 1
        self._evict()
        return tree.path

    def _checked(self, key: TreeKey, tree: _Tree | None, store: ContentStore,
                 files: Sequence[ToolFile]) -> _Tree:
        """The tree for `key` after the full checks (made again when not intact). When
        its paths can be watched it is checked once more after the watch began: the
        moment taken then stands for that check until something changes."""
        tree = self._intact_or_new(key, tree, store, files)
        tree.checked = None
        moment = self.watch.moment(self._watched(tree))
        if moment is None:
            return tree
        if _intact(tree, store.sources(files), files):
            tree.checked = moment
            return tree
        return self._intact_or_new(key, tree, store, files)  # changed meanwhile

    def _intact_or_new(self, key: TreeKey, tree: _Tree | None, store: ContentStore,
                       files: Sequence[ToolFile]) -> _Tree:
        sources = store.sources(files)
        if tree is None or not _intact(tree, sources, files):
            if tree is not None:
                self._retire(key, tree)
            tree = self._make(key, store, files)
        return tree

    def _watched(self, tree: _Tree) -> tuple[Dependency, ...] | None:
        paths: set[str] = set()
        for parts, source, _made, _linked in tree.files:
            paths.add(str(tree.path.joinpath(*parts)))
            paths.add(str(source))
        return self.watch.watch(sorted(paths))

    def release(self, path: Path) -> None:
        """A run that leased `path` is over (a replaced tree goes with its last run)."""
        for tree in self._trees.values():
            if tree.path == path:
                tree.leases -= 1
                return
        for tree in self._retiring:
            if tree.path == path:
                tree.leases -= 1
                if tree.leases <= 0:
                    self._retiring.remove(tree)
                    shutil.rmtree(tree.path, ignore_errors=True)
                return

    def _make(self, key: TreeKey, store: ContentStore, files: Sequence[ToolFile]) -> _Tree:
        self._made += 1
        name = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
        path = self.root / f"{name}-{self._made}"
        path.mkdir(mode=0o755)
        try:
            store.materialise(files, path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        made = []
        for parts, source in store.sources(files):
            info = os.stat(path.joinpath(*parts))
            linked = info.st_ino == os.stat(source).st_ino
            made.append((parts, source, _signature(info), linked))
        tree = _Tree(path, made)
        self._trees[key] = tree
        return tree

    def _retire(self, key: TreeKey, tree: _Tree) -> None:
        del self._trees[key]
        if tree.leases > 0:
            self._retiring.append(tree)
        else:
            shutil.rmtree(tree.path, ignore_errors=True)

    def _evict(self) -> None:
        for key, tree in list(self._trees.items()):
            if len(self._trees) <= self.keep:
                return
            if tree.leases == 0:
                self._retire(key, tree)


def _intact(tree: _Tree, sources: list[tuple[tuple[str, ...], Path]],
            files: Sequence[ToolFile]) -> bool:
    """Each file of `tree` is still the file made from the verified object. A file
    whose change time alone moved (a hard link to its inode made or removed by a run
    in a host folder, which shares the store's objects) is hashed again and, when it
    still holds its verified bytes, kept with its new signature."""
    if len(sources) != len(tree.files):
        return False
    for index, ((parts, source), (made_parts, made_from, signature, linked), file) in \
            enumerate(zip(sources, tree.files, files, strict=True)):
        if parts != made_parts or source != made_from:
            return False
        try:
            path = tree.path.joinpath(*parts)
            info = os.stat(path)
            if linked and os.stat(source).st_ino != info.st_ino:
                return False
            now = _signature(info)
            if now == signature:
                continue
            if now[:3] + now[4:] != signature[:3] + signature[4:] \
                    or file_sha256(path) != file.sha256:
                return False
            tree.files[index] = (parts, source, now, linked)
        except OSError:
            return False
    return True


_PREFIX = "toolexec-sandbox-"


class SandboxCache:
    """This process's EtcView and ToolTrees, in one private folder removed at exit
    (or, after a kill, by the next process that makes one: `remove_orphans`), and the
    shared parts of the namespace launcher's requests (run_request)."""

    def __init__(self, etc_entries: Sequence[str]) -> None:
        remove_orphans(Path(tempfile.gettempdir()))
        self.root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        self.watch = HostWatch()
        self.etc = EtcView(self.root / "etc", etc_entries, watch=self.watch)
        trees = self.root / "trees"
        trees.mkdir(mode=0o700)
        self.trees = ToolTrees(trees, watch=self.watch)
        self.answers: WatchedAnswers[Any] = WatchedAnswers(self.watch)
        self.requests = RequestCache()
        atexit.register(shutil.rmtree, self.root, True)
        atexit.register(self.watch.close)


def remove_orphans(folder: Path) -> None:
    """Remove the cache folders in `folder` of this user's processes that are gone."""
    for path in folder.glob(f"{_PREFIX}*-*"):
        pid = path.name[len(_PREFIX):].split("-", 1)[0]
        try:
            if not pid.isdigit() or path.stat().st_uid != os.geteuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive under another uid, or vanished meanwhile
            continue


_SHARED: dict[int, SandboxCache] = {}


def shared_cache(etc_entries: Sequence[str]) -> SandboxCache:
    """The SandboxCache of this process (made on first use, again after a fork)."""
    cache = _SHARED.get(os.getpid())
    if cache is None:
        cache = _SHARED[os.getpid()] = SandboxCache(etc_entries)
    return cache
