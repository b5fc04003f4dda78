"""Whether host paths a cache verified may have changed since: one inotify descriptor.

The sandbox cache (sandbox_cache) checks before every run that the `/etc` entries a
sandbox shows and the files of a tool tree are still what it verified: ~25 `stat`s
and their bookkeeping, ~0.2 ms on the run's path. With a `HostWatch` those checks are
made once and then skipped while nothing they looked at changed: every path they
rely on is watched (its content, attributes, its name in its folder, and for a
symbolic link each folder on its way), and `moment()` reads the kernel's queue of
changes (one `ioctl` when it is empty). Any change, to a watched path or to anything
else in a watched folder, ends every verification made before it; so does a full
queue. A path that cannot be watched (no inotify, the user's limit of watches
reached) makes `watch` answer False, and the caller checks every time as before.
Changes the kernel does not report through inotify (a network filesystem changed by
another host) are not seen: the sandbox cache and the content store are local.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from inotify_simple import INotify
from inotify_simple import flags as _flags

_CHANGES = (_flags.MODIFY | _flags.ATTRIB | _flags.CLOSE_WRITE | _flags.MOVED_FROM
            | _flags.MOVED_TO | _flags.CREATE | _flags.DELETE | _flags.DELETE_SELF
            | _flags.MOVE_SELF)
_MAX_LINKS = 40  # the kernel's own bound on symbolic links followed in one lookup
_READ_BYTES = 65536
T = TypeVar("T")


class HostWatch:
    """Tells whether watched host paths may have changed since a `moment`."""

    def __init__(self) -> None:
        try:
            self._inotify: INotify | None = INotify(nonblocking=True)
        except OSError:
            self._inotify = None
        self._fd = -1 if self._inotify is None else self._inotify.fileno()
        self._lock = threading.Lock()
        self._generation = 0

    def watch(self, paths: Iterable[str], *, ancestors: bool = False) -> bool:
        """Watch each path (the file it resolves to, its folder, and for a symbolic
        link every link and folder on its way; with `ancestors`, every folder above
        each of those too). False when one of them cannot be watched: then no
        verification of these paths may be trusted to last."""
        if self._inotify is None:
            return False
        try:
            for path in paths:
                for target in _watched(os.path.abspath(path), ancestors):
                    self._add(target)
        except OSError:
            return False
        return True

    def moment(self) -> int | None:
        """A token for now (None without inotify): `unchanged(token)` holds until a
        watched path changes."""
        if self._inotify is None:
            return None
        with self._lock:
            changed = False
            while True:
                try:
                    if not os.read(self._fd, _READ_BYTES):
                        break
                except BlockingIOError:
                    break
                changed = True
            self._generation += changed
            return self._generation

    def unchanged(self, since: int | None) -> bool:
        """True when nothing watched changed after `since` was taken."""
        return since is not None and self.moment() == since

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
            self._fd = -1

    def _add(self, path: str) -> None:
        assert self._inotify is not None
        with contextlib.suppress(FileNotFoundError):  # its folder reports when it comes
            self._inotify.add_watch(path, _CHANGES)


def _watched(path: str, ancestors: bool) -> list[str]:
    """What to watch for `path`: its folder (every folder above it with `ancestors`),
    each symbolic link on its way with its folder, and the file it resolves to."""
    targets: list[str] = []
    for _ in range(_MAX_LINKS):
        targets.append(path)
        folder = os.path.dirname(path)
        targets.append(folder)
        while ancestors and folder != os.path.dirname(folder):
            folder = os.path.dirname(folder)
            targets.append(folder)
        try:
            link = os.readlink(path)
        except OSError:  # not a link (or absent): the end of its way
            return targets
        path = os.path.normpath(os.path.join(os.path.dirname(path), link))
    raise OSError(f"too many symbolic links on the way to {path}")


class WatchedAnswers(Generic[T]):
    """Answers computed from host paths alone (a `realpath`, a lookup on PATH), each
    kept while nothing it was computed from changed (the most recent `keep`)."""

    def __init__(self, watch: HostWatch, keep: int = 256) -> None:
        self._watch = watch
        self._keep = keep
        self._answers: OrderedDict[Hashable, tuple[int, T]] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T],
            paths: Callable[[T], Iterable[str]]) -> T:
        """`compute()`, or its earlier answer for `key` while the paths that answer
        depends on (`paths(answer)`, watched with their ancestors) are unchanged."""
        known = self._answers.get(key)
        if known is not None and self._watch.unchanged(known[0]):
            return known[1]
        answer = compute()
        if not self._watch.watch(paths(answer), ancestors=True):
            return answer
        moment = self._watch.moment()
        again = compute()  # after the watch began: what it sees is what a change ends
        if again == answer and moment is not None:
            self._answers[key] = (moment, again)
            self._answers.move_to_end(key)
            while len(self._answers) > self._keep:
                self._answers.popitem(last=False)
        return again
