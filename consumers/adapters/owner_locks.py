"""Which owners of a SQLite claim store (one host) are gone.

Every open `SqliteClaims` holds an exclusive `flock` on a file of its own in a folder
beside the store, named after its owner. The kernel drops the lock when the process
ends, however it ends (SIGKILL too), or when the store is closed. An owner whose file
is there and unlocked is gone: it can neither start nor conclude an attempt any more,
so the lease of a claim it left unfinished need not be waited out. An owner without a
file (a claim written before owners held one) counts as alive: its lease holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path


def _file_name(owner: str) -> str:
    return hashlib.sha256(owner.encode()).hexdigest()[:32]


class OwnerLocks:
    """This store's owner lock (held until `close`), and the others' liveness."""

    def __init__(self, directory: Path, owner: str) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._directory = directory
        self._fd: int | None = _hold(directory / _file_name(owner))

    def gone(self, owner: str) -> bool:
        """True when `owner` held a lock here and holds it no more."""
        try:
            return not lock_held(self._directory / _file_name(owner))
        except FileNotFoundError:
            return False

    def sweep(self, needed: Iterable[str]) -> None:
        """Remove the files of gone owners, but those of `needed` owners (the ones
        with claims left unfinished: their files tell that they are gone)."""
        keep = {_file_name(owner) for owner in needed}
        for path in self._directory.iterdir():
            if path.name in keep:
                continue
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    path.unlink()  # held: no owner can take it meanwhile (see _hold)
                finally:
                    os.close(fd)

    def close(self) -> None:
        """Drop this store's lock: from now on its owner is gone."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def lock_held(path: Path) -> bool:
    """True while a process holds an exclusive `flock` on `path` (FileNotFoundError
    when there is no such file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a shared lock we got
    return False


def _hold(path: Path) -> int:
    """Open `path` and lock it for good; again when a sweep removed it meanwhile (the
    lock must be on the file that has that name)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
