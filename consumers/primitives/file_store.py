"""Content-addressed store of tool files, and materialisation of a tool's file tree.

Objects live at `root/aa/bb/<sha256 hex>` (read-only, 0o444). Executable files get a
sibling `<hex>.x` (0o555), because a mode belongs to an inode and materialised files
are hard links to store objects: materialising the same tool again costs one `link`
per file, no copy and no hashing.

Every object is hashed once per process before it is first used; afterwards a cheap
`stat` signature (size, mtime, mode) stands for that verification. A tool that writes
to its (shared) file therefore changes the signature, and the next use re-hashes the
object: a correct copy is restored from the bytes at hand, otherwise IntegrityMismatch.
Hard links cannot stop a tool running as root from writing; the signature check is
what keeps such a write from silently reaching the next run. When linking is not
possible (another filesystem, link-count limit) files are copied instead, with the
conventional modes 0o755 / 0o644.

Files of the registry view arrive compressed (`ToolFile.packed`): one is inflated
only when its object is not in the store yet, never past its declared size, and
checked against its sha256 before it is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from domain import paths
from domain.errors import ExecutionError, IntegrityMismatch, RegistryError
from domain.model import ToolFile
from domain.publication_limits import packed_content

_HEX = re.compile(r"[0-9a-f]{64}")
_READ_CHUNK = 1 << 20
_MEMO_MAX = 4096
_OBJECT_MODE = 0o444
_EXECUTABLE_OBJECT_MODE = 0o555
_COPY_MODE = 0o644
_EXECUTABLE_COPY_MODE = 0o755

Signature = tuple[int, int, int, int, int]
"""(inode, size, mtime, ctime, mode): the change time too, which no one can set back,
so that bytes changed behind a restored size and mtime are hashed again."""


def relative_parts(path: str, *, allow_root: bool = False) -> tuple[str, ...]:
    """Split a POSIX path relative to a tool root into its components (the rule of
    `domain.paths.relative_parts`), refusing with ExecutionError E3401 what it refuses.
    `allow_root` accepts a path naming the root itself ("." or ""), as a working
    directory may.
    """
    parts = paths.relative_parts(path, allow_root=allow_root)
    if parts is None:
        raise _unsafe(path)
    return parts


def _unsafe(path: str) -> ExecutionError:
    return ExecutionError(f"unsafe tool file path {path!r}: it must stay inside the tool root",
                          code="E3401", details={"path": path})


class ContentStore:
    """Content-addressed files under `root`, verified by sha256 before every use."""

    def __init__(self, root: Path) -> None:
        self._root = Path(root)
        self._signatures: dict[str, Signature] = {}  # object path -> stat when verified
        self._hashed: dict[str, bytes] = {}  # sha256 -> a bytes object already hashed

    @property
    def root(self) -> Path:
        """The directory holding the objects."""
        return self._root

    def put(self, content: bytes) -> str:
        """Store `content` (atomically, once) and return its sha256 hex digest."""
        digest = hashlib.sha256(content).hexdigest()
        self._remember_hashed(digest, content)
        path = self._object_path(digest)
        if not self._intact(path, digest, _OBJECT_MODE):
            self._write_object(path, content, _OBJECT_MODE)
        return digest

    def get(self, sha256: str) -> bytes:
        """The bytes of object `sha256`, hashed on read.

        Raises IntegrityMismatch when the stored bytes do not hash to `sha256`, and
        RegistryError (E3105) when the object is missing.
        """
        path = self._object_path(sha256)
        try:
            content = path.read_bytes()
        except FileNotFoundError:
            raise RegistryError(f"file {sha256} is not in the content store",
                                details={"sha256": sha256}) from None
        actual = hashlib.sha256(content).hexdigest()
        if actual != sha256:
            raise IntegrityMismatch(f"stored file {sha256} is corrupt",
                                    details={"expected": sha256, "actual": actual})
        return content

    def has(self, sha256: str) -> bool:
        """True when an object for `sha256` exists (not hashed: `get` verifies)."""
        return self._object_path(sha256).is_file()

    def materialise(self, files: Sequence[ToolFile], dest: Path) -> None:
        """Write every file under `dest` at its relative path.

        All paths and hashes are checked before anything is written: an unsafe path
        raises ExecutionError (E3401), bytes not matching their sha256 raise
        IntegrityMismatch, a file neither carried nor stored raises RegistryError.
        Files are hard links to read-only store objects (0o555 executable, 0o444
        otherwise) or, where linking fails, copies (0o755 / 0o644).
        """
        made: set[tuple[str, ...]] = set()
        for (parts, source), file in zip(self.sources(files), files, strict=True):
            parent = _make_parents(dest, parts[:-1], made)
            _place(source, file, parent / parts[-1])

    def sources(self, files: Sequence[ToolFile]) -> list[tuple[tuple[str, ...], Path]]:
        """(relative path parts, verified store object) of every file: the checks of
        `materialise` (paths, then bytes) without writing anything outside the store."""
        targets = _targets(files)
        return list(zip(targets, [self._source_for(file) for file in files], strict=True))

    def check_inline(self, files: Sequence[ToolFile]) -> None:
        """The bytes `files` carry hash to their sha256 (IntegrityMismatch else): what
        `sources` checks of a plan itself, for a caller that knows the store's
        objects are unchanged since it last had them checked."""
        for file in files:
            if file.content is not None:
                self._check_content(file, file.content)

    # -- objects -------------------------------------------------------------------

    def _object_path(self, sha256: str) -> Path:
        if not _HEX.fullmatch(sha256):
            raise IntegrityMismatch(f"malformed sha256 {sha256!r}", details={"sha256": sha256})
        return self._root / sha256[:2] / sha256[2:4] / sha256

    def _source_for(self, file: ToolFile) -> Path:
        """A verified store object holding `file`'s bytes with `file`'s mode."""
        base = self._object_path(file.sha256)
        path, mode = (base.with_name(base.name + ".x"), _EXECUTABLE_OBJECT_MODE) \
            if file.is_executable else (base, _OBJECT_MODE)
        if file.content is not None:
            self._check_content(file, file.content)
            if not self._intact(path, file.sha256, mode):
                self._write_object(path, file.content, mode)
            return path
        if self._intact(path, file.sha256, mode):
            return path
        if file.packed is not None:
            content = packed_content(file.packed, sha256=file.sha256, size=file.size,
                                     path=file.path)
            self._write_object(path, content, mode)
            return path
        self._write_object(path, self.get(file.sha256), mode)
        return path

    def _check_content(self, file: ToolFile, content: bytes) -> None:
        if self._hashed.get(file.sha256) is content:
            return  # this very (immutable) bytes object was hashed before
        actual = hashlib.sha256(content).hexdigest()
        if actual != file.sha256:
            raise IntegrityMismatch(
                f"tool file {file.path!r} does not match its sha256",
                details={"path": file.path, "expected": file.sha256, "actual": actual},
            )
        self._remember_hashed(actual, content)

    def _remember_hashed(self, digest: str, content: bytes) -> None:
        if len(self._hashed) >= _MEMO_MAX:
            self._hashed.pop(next(iter(self._hashed)))
        self._hashed[digest] = content

    def _intact(self, path: Path, sha256: str, mode: int) -> bool:
        """True when `path` exists, holds `sha256`'s bytes and has `mode`."""
        key = str(path)
        try:
            info = os.stat(key)
        except FileNotFoundError:
            return False
        if self._signatures.get(key) == _signature(info):
            return True
        if file_sha256(key) != sha256:
            self._signatures.pop(key, None)
            return False
        if stat.S_IMODE(info.st_mode) != mode:
            os.chmod(key, mode)
            info = os.stat(key)
        self._signatures[key] = _signature(info)
        return True

    def _write_object(self, path: Path, content: bytes, mode: int) -> None:
        """Atomic write: a temp file in the same directory renamed over `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
                os.fchmod(handle.fileno(), mode)
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        if len(self._signatures) >= _MEMO_MAX:
            self._signatures.pop(next(iter(self._signatures)))
        self._signatures[str(path)] = _signature(os.stat(path))


def _signature(info: os.stat_result) -> Signature:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode)


def file_sha256(path: str | Path) -> str:
    """The sha256 (hex) of the bytes in `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _targets(files: Sequence[ToolFile]) -> list[tuple[str, ...]]:
    """Checked, duplicate-free relative paths, one per file."""
    targets = [relative_parts(file.path) for file in files]
    seen: set[tuple[str, ...]] = set()
    for parts, file in zip(targets, files, strict=True):
        if parts in seen:
            raise ExecutionError(f"tool file path {file.path!r} appears twice",
                                 code="E3401", details={"path": file.path})
        seen.add(parts)
    return targets


def _make_parents(dest: Path, parts: tuple[str, ...], made: set[tuple[str, ...]]) -> Path:
    """Create the directories of `parts` under `dest`, refusing symlinks and files
    in the way so no write can land outside `dest`."""
    current = dest
    for depth in range(1, len(parts) + 1):
        current = current / parts[depth - 1]
        if parts[:depth] in made:
            continue
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                raise _unsafe("/".join(parts[:depth])) from None
        made.add(parts[:depth])
    return current


def _place(source: Path, file: ToolFile, target: Path) -> None:
    """Hard-link `source` at `target` (replacing a file there), copying if linking fails."""
    try:
        existing = os.lstat(target)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(existing.st_mode):
            raise _unsafe(file.path)
        os.unlink(target)  # a symlink is removed itself, never followed
    try:
        os.link(source, target)
    except OSError:
        _copy(source, target, _EXECUTABLE_COPY_MODE if file.is_executable else _COPY_MODE)


def _copy(source: Path, target: Path, mode: int) -> None:
    content = source.read_bytes()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
        os.fchmod(handle.fileno(), mode)
