"""Whether host paths a cache verified may have changed since: one inotify descriptor.

The sandbox cache (sandbox_cache) checks before every run that the `/etc` entries a
sandbox shows and the files of a tool tree are still what it verified: ~25 `stat`s
and their bookkeeping on the run's path. With a `HostWatch` those checks are made
once and then skipped while nothing they relied on changed. `watch` watches every
path a check reads: the file it resolves to (any change to it), its name in its
folder, for a symbolic link each link and the name of each on its way, and with
`ancestors` the name of every folder above them; it returns those dependencies, and
`moment(dependencies)` a token that `unchanged` compares after reading the kernel's
queue of changes (one `read` when it is empty). Only changes to what a token depends
on end it: a busy folder above a watched path (say /tmp) ends only the tokens of
paths through the name that changed. A full queue ends every token. A path that
cannot be watched (no inotify, the user's limit of watches reached) makes `watch`
answer None, and the caller checks every time as before. Changes the kernel does not
report through inotify (a network filesystem changed by another host) are not seen:
the sandbox cache and the content store are local.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from inotify_simple import INotify, parse_events
from inotify_simple import flags as _flags

_CHANGES = (_flags.MODIFY | _flags.ATTRIB | _flags.CLOSE_WRITE | _flags.MOVED_FROM
            | _flags.MOVED_TO | _flags.CREATE | _flags.DELETE | _flags.DELETE_SELF
            | _flags.MOVE_SELF)
_MAX_LINKS = 40  # the kernel's own bound on symbolic links followed in one lookup
_READ_BYTES = 65536
T = TypeVar("T")
Dependency = tuple[int, str | None]
"""(watch descriptor, name): a change to the watched object itself when the name is
"", to its entry `name` when it is a folder, to anything of it when None."""


@dataclass(frozen=True)
class Token:
    """What a set of dependencies had seen at a moment (see HostWatch.moment), and
    how many times the kernel's queue had overflowed (events lost: every token ends).
    `serial`: how many relevant changes the watch had seen in all; while that number
    has not moved, nothing any token depends on changed (the usual case, one
    comparison instead of one per dependency)."""

    dependencies: tuple[Dependency, ...]
    counts: tuple[int, ...]
    overflows: int
    serial: int = field(default=-1, compare=False)


class HostWatch:
    """Tells whether watched host paths may have changed since a `moment`."""

    def __init__(self) -> None:
        try:
            self._inotify: INotify | None = INotify(nonblocking=True)
        except OSError:
            self._inotify = None
        self._fd = -1 if self._inotify is None else self._inotify.fileno()
        self._lock = threading.Lock()
        self._wanted: dict[int, set[str | None]] = {}  # by watch: the names depended on
        self._counts: dict[int, dict[str | None, int]] = {}  # changes seen to those
        self._gone: set[int] = set()  # watches the kernel removed (their inode went)
        self._overflows = 0
        self._serial = 0  # counted changes, overflows and watches gone, in all

    def watch(self, paths: Iterable[str], *,
              ancestors: bool = False) -> tuple[Dependency, ...] | None:
        """Watch what each path's check relies on (see the module docstring) and
        return those dependencies; None when one of them cannot be watched."""
        if self._inotify is None:
            return None
        found: dict[Dependency, None] = {}
        try:
            for path in paths:
                ways = {os.path.abspath(path), os.path.realpath(path)}  # links midway too
                for target, name in (step for way in ways for step in _watched(way, ancestors)):
                    wd = self._add(target)
                    if wd is not None:
                        found[(wd, name)] = None
                        if name:
                            found[(wd, "")] = None  # the folder itself moved or removed
        except OSError:
            return None
        with self._lock:
            for wd, name in found:
                self._wanted.setdefault(wd, set()).add(name)
        return tuple(found)

    def moment(self, dependencies: tuple[Dependency, ...] | None) -> Token | None:
        """A token for now: `unchanged(token)` holds until one of `dependencies`
        changes. None without dependencies (nothing could be watched)."""
        if dependencies is None or self._inotify is None:
            return None
        with self._lock:
            self._drain()
            return self._token(dependencies)

    def unchanged(self, since: Token | None) -> bool:
        """True when nothing `since` depends on changed after it was taken."""
        return self.renewed(since) is not None

    def renewed(self, since: Token | None) -> Token | None:
        """`since` as of now when nothing it depends on changed after it was taken
        (keep it instead: its next check is then one comparison), else None."""
        if since is None or self._inotify is None:
            return None
        with self._lock:
            self._drain()
            if since.serial == self._serial:
                return since
            now = self._token(since.dependencies)
            return now if now == since else None

    def _token(self, dependencies: tuple[Dependency, ...]) -> Token | None:
        if any(wd in self._gone for wd, _name in dependencies):
            return None
        return Token(dependencies, tuple(self._counts.get(wd, {}).get(name, 0)
                                         for wd, name in dependencies),
                     self._overflows, self._serial)

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
            self._fd = -1

    def _add(self, path: str) -> int | None:
        assert self._inotify is not None
        with contextlib.suppress(FileNotFoundError):  # its folder reports when it comes
            return int(self._inotify.add_watch(path, _CHANGES))
        return None

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                return
            if not data:
                return
            for event in parse_events(data):
                self._seen(event.wd, event.mask, event.name)

    def _seen(self, wd: int, mask: int, name: str) -> None:
        if mask & _flags.Q_OVERFLOW:
            self._overflows += 1
            self._serial += 1
        if mask & _flags.IGNORED:  # the watch is gone: whatever relied on it ends
            self._serial += 1
            self._gone.add(wd)
            self._wanted.pop(wd, None)
            self._counts.pop(wd, None)
            return
        wanted = self._wanted.get(wd)
        if not wanted:
            return  # only names something depends on are counted (a busy /tmp)
        counts = self._counts.setdefault(wd, {})
        for key in (None, name):
            if key in wanted:
                counts[key] = counts.get(key, 0) + 1
                self._serial += 1


def _watched(path: str, ancestors: bool) -> list[tuple[str, str | None]]:
    """What to watch for `path`, as (path to watch, name in it or None for anything):
    its name in its folder (in every folder above it with `ancestors`), each symbolic
    link on its way likewise, and the file it resolves to."""
    targets: list[tuple[str, str | None]] = []
    for _ in range(_MAX_LINKS):
        child = path
        while True:
            folder = os.path.dirname(child)
            if folder == child:
                break
            targets.append((folder, os.path.basename(child)))
            if not ancestors:
                break
            child = folder
        try:
            link = os.readlink(path)
        except OSError:  # not a link (or absent): the end of its way
            targets.append((path, None))
            return targets
        path = os.path.normpath(os.path.join(os.path.dirname(path), link))
    raise OSError(f"too many symbolic links on the way to {path}")


class WatchedAnswers(Generic[T]):
    """Answers computed from host paths alone (a `realpath`, a lookup on PATH), each
    kept while nothing it was computed from changed (the most recent `keep`)."""

    def __init__(self, watch: HostWatch, keep: int = 256) -> None:
        self._watch = watch
        self._keep = keep
        self._answers: OrderedDict[Hashable, tuple[Token, T]] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T],
            paths: Callable[[T], Iterable[str]]) -> T:
        """`compute()`, or its earlier answer for `key` while the paths that answer
        depends on (`paths(answer)`, watched with their ancestors) are unchanged."""
        known = self._answers.get(key)
        if known is not None:
            renewed = self._watch.renewed(known[0])
            if renewed is not None:
                if renewed is not known[0]:
                    self._answers[key] = (renewed, known[1])
                return known[1]
        answer = compute()
        moment = self._watch.moment(self._watch.watch(paths(answer), ancestors=True))
        if moment is None:
            return answer
        again = compute()  # after the watch began: what it sees is what a change ends
        if again == answer:
            self._answers[key] = (moment, again)
            self._answers.move_to_end(key)
            while len(self._answers) > self._keep:
                self._answers.popitem(last=False)
        return again
