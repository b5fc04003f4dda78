"""The state directory and its files are private to the user running toolexec.

`.toolexec/` holds every caller's parameters and results (the read-model database),
the executor's claims with their recorded outcomes, the dev signing key, the
runtime file and the broker's logs. The directory is 0700 and those files 0600, also
when they were made by an older version with wider modes. SQLite gives a database's
`-wal` and `-shm` files the database file's mode, so a private database stays
private. Tool files in the content store keep their own read-only modes (a sandboxed
tool running as another uid reads them through its bind mounts, not through this
directory's path).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
PRIVATE_FILES = ("toolexec.db", "toolexec.db-wal", "toolexec.db-shm", "claims.sqlite3",
                 "claims.sqlite3-wal", "claims.sqlite3-shm", "runtime.json")
PRIVATE_DIRS = ("keys", "logs")


def ensure_state_dir(state: Path) -> Path:
    """Create `state` (0700) if needed and make it and the files it already holds
    private; returns `state`."""
    state.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    _chmod(state, DIR_MODE)
    for name in PRIVATE_FILES:
        _chmod(state / name, FILE_MODE)
    for name in PRIVATE_DIRS:
        folder = state / name
        if folder.is_dir() and not folder.is_symlink():
            _chmod(folder, DIR_MODE)
            for entry in folder.iterdir():
                if entry.is_file() and not entry.is_symlink() and entry.suffix != ".pub" \
                        and entry.name != "public.pem":
                    _chmod(entry, FILE_MODE)
    return state


class DirectoryIdentity:
    """The directory a path named when it was taken: a process keeps working on a state
    directory only while its path names that same directory, not once it was deleted,
    moved away or replaced by another (a backup put back). An open descriptor keeps the
    directory's inode from being given to a directory made again under the same path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    def still_there(self) -> bool:
        if self._fd is None:
            raise ValueError("closed")
        try:
            named = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        held = os.fstat(self._fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _chmod(path: Path, mode: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        try:
            if path.is_symlink():
                return
            os.chmod(path, mode)
        except PermissionError:  # another user's file: say so, do not fail the start
            log.warning("state.cannot_restrict", path=str(path), mode=oct(mode))
