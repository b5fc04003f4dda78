"""Limits on what a tool publication may hold, checked before anything is inflated.

A publication carries its files gzip-compressed; a few hundred kilobytes of gzip can
inflate to gigabytes (a sparse file), and tens of thousands of empty files cost
nothing to compress. So every reader of a publication checks, in this order and
without trusting what the publisher declared: the number of files, the declared
uncompressed sizes, then each file's real size while inflating in bounded chunks
(never more than the limit is produced, and what is produced is hashed and dropped).
Pure: zlib and hashlib only.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from domain.errors import RegistryError

MIB: Final = 1024 * 1024
DEFAULT_MAX_FILES: Final = 1000
DEFAULT_MAX_BYTES: Final = 20 * MIB
_CHUNK: Final = 256 * 1024
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS


class PublicationTooLarge(RegistryError):
    """A publication past a limit: too many files, too many bytes once inflated, or
    compressed data that does not inflate to what it declares (E3105)."""

    code = "E3105"


@dataclass(frozen=True, slots=True)
class PublicationLimits:
    """Operator limits of one tool version: file count and total uncompressed bytes."""

    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES

    def check_declared(self, sizes: Iterable[tuple[str, int]]) -> None:
        """Check the file count and the declared (or on-disk) sizes `(path, bytes)`
        before reading or inflating anything. Raises PublicationTooLarge."""
        listed = list(sizes)
        if len(listed) > self.max_files:
            raise PublicationTooLarge(
                f"{len(listed)} files is more than the {self.max_files}-file limit of a tool",
                details={"limit": "files", "max": self.max_files, "actual": len(listed)})
        total = 0
        for path, size in listed:
            if size < 0:
                raise PublicationTooLarge(f"file {path!r} declares a negative size",
                                          details={"path": path, "size": size})
            total += size
            if total > self.max_bytes:
                raise PublicationTooLarge(
                    f"the tool's files add up to more than the {self.max_bytes}-byte limit "
                    f"(uncompressed), reached at {path!r}",
                    details={"limit": "bytes", "max": self.max_bytes, "path": path})


DEFAULT_LIMITS: Final = PublicationLimits()


@dataclass(frozen=True, slots=True)
class Inflated:
    """What a compressed file inflates to: its size and sha256, bytes when kept."""

    size: int
    sha256: str
    content: bytes | None = None


def inflate(packed: bytes, *, limit: int, keep: bool = True, path: str = "") -> Inflated:
    """Inflate one gzip member in bounded chunks. Raises PublicationTooLarge as soon as
    more than `limit` bytes come out, and for data that is not one complete gzip
    member. With `keep=False` the bytes are only measured and hashed."""
    inflater = zlib.decompressobj(_GZIP_WBITS)
    digest = hashlib.sha256()
    parts: list[bytes] = []
    size = 0
    data = packed
    while True:
        try:
            chunk = inflater.decompress(data, _CHUNK)
        except zlib.error as error:
            raise PublicationTooLarge(f"file {path!r} is not valid gzip data: {error}",
                                      details={"path": path}) from None
        size += len(chunk)
        if size > limit:
            raise PublicationTooLarge(
                f"file {path!r} inflates to more than {limit} bytes",
                details={"limit": "bytes", "max": limit, "path": path})
        digest.update(chunk)
        if keep:
            parts.append(chunk)
        data = inflater.unconsumed_tail
        if inflater.eof or (not data and not chunk):
            break
    if not inflater.eof or inflater.unused_data:
        raise PublicationTooLarge(f"file {path!r} is not one complete gzip member",
                                  details={"path": path})
    return Inflated(size, digest.hexdigest(), b"".join(parts) if keep else None)


def packed_content(packed: bytes, *, sha256: str, size: int | None, path: str = "",
                   limit: int = DEFAULT_MAX_BYTES) -> bytes:
    """The bytes of a compressed file that declares `sha256` (and `size`, when known),
    inflating at most `size` (else `limit`) bytes. Raises PublicationTooLarge when it
    holds more or fewer bytes, RegistryError when they do not hash to `sha256`."""
    inflated = inflate(packed, limit=limit if size is None else size, path=path)
    check_inflated(inflated, sha256=sha256, size=size, path=path)
    assert inflated.content is not None
    return inflated.content


def check_inflated(inflated: Inflated, *, sha256: str, size: int | None,
                   path: str = "") -> None:
    """The inflated file is the one declared: same size (when declared), same sha256."""
    if size is not None and inflated.size != size:
        raise PublicationTooLarge(f"file {path!r} declares {size} bytes but inflates to "
                                  f"{inflated.size}",
                                  details={"path": path, "declared": size,
                                           "actual": inflated.size})
    if inflated.sha256 != sha256:
        raise RegistryError(f"file {path!r} does not match its sha256",
                            details={"path": path, "expected": sha256,
                                     "actual": inflated.sha256})
