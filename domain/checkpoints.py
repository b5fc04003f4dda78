"""A tool's checkpoint state as stored: canonical JSON, its hash, delta and compression.

The state is the tool's JSON object, kept as its RFC 8785 canonical JSON and named by
`sha256:<hex>` of those bytes (`state_hash`, its address in the checkpoint store).
What is stored is either the whole state or, when that is at most half as large, a
JSON merge patch (RFC 7386, domain.merge_patch) against the previous checkpoint of the
same run — at most `MAX_DELTA_CHAIN` deltas in a row, so restoring one never walks far
— each gzip-compressed above `GZIP_THRESHOLD` bytes when that makes it smaller.
Restoring checks every link against its hash (E3904 when one does not match).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import rfc8785

from domain.canonical_json import canonical_json
from domain.errors import ToolexecError
from domain.integrity import sha256_ref
from domain.merge_patch import apply_patch, diff

GZIP_THRESHOLD = 1024
"""Stored bytes above this size are gzip-compressed (when that makes them smaller)."""
DEFAULT_MAX_STATE_BYTES = 4 * 1024 * 1024
"""The cap on a state's canonical JSON (E3906 past it)."""
MAX_DELTA_CHAIN = 16
"""A checkpoint is stored whole after this many deltas in a row."""
DELTA_WORTH = 0.5
"""A delta is stored when its bytes are at most this share of the whole state's."""

Compression = Literal["none", "gzip"]


class CheckpointError(ToolexecError):
    """E3903 (not in the store), E3904 (corrupted), E3906 (state not storable)."""

    code = "E3904"


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """One checkpoint as the store keeps it: `payload` is the state's canonical JSON
    or, with `delta_of`, a merge patch against that checkpoint, then compressed."""

    state_hash: str
    size: int
    payload: bytes
    compression: Compression
    delta_of: str | None

    @property
    def stored_size(self) -> int:
        return len(self.payload)


@dataclass(frozen=True, slots=True)
class Restored:
    """A checkpoint's state, restored: what the next checkpoint may be a delta of."""

    state_hash: str
    state: dict[str, Any]
    canonical: bytes
    depth: int
    """Deltas in a row ending with this checkpoint (0: stored whole)."""


def state_hash(canonical: bytes) -> str:
    """The state's address in the checkpoint store."""
    return sha256_ref(canonical)


def canonical_state(state: Any, max_bytes: int = DEFAULT_MAX_STATE_BYTES) -> bytes:
    """The canonical JSON of a state (a JSON object); E3906 when it is none or larger
    than `max_bytes`."""
    if not isinstance(state, dict):
        raise CheckpointError("State serialization failed: a checkpoint's state must be a "
                              "JSON object", code="E3906", details={"type": type(state).__name__})
    try:
        canonical = canonical_json(state)
    except (rfc8785.CanonicalizationError, ValueError, TypeError) as error:
        raise CheckpointError(f"State serialization failed: {error}", code="E3906") from error
    if len(canonical) > max_bytes:
        raise CheckpointError(
            f"State serialization failed: the state takes {len(canonical)} bytes as "
            f"canonical JSON, over the checkpoint cap of {max_bytes} bytes",
            code="E3906", details={"size": len(canonical), "max_bytes": max_bytes})
    return canonical


def encode_checkpoint(state: dict[str, Any], previous: Restored | None, *,
                      max_bytes: int = DEFAULT_MAX_STATE_BYTES,
                      gzip_threshold: int = GZIP_THRESHOLD) -> tuple[StoredCheckpoint, Restored]:
    """How to store `state` after `previous` (None: the run's first); also the
    state as the next checkpoint's base. Raises CheckpointError E3906 (see
    canonical_state)."""
    canonical = canonical_state(state, max_bytes)
    digest = state_hash(canonical)
    body, delta_of, depth = canonical, None, 0
    if previous is not None and previous.depth < MAX_DELTA_CHAIN:
        patch = _delta(previous, state, canonical)
        if patch is not None and len(patch) <= len(canonical) * DELTA_WORTH:
            body, delta_of, depth = patch, previous.state_hash, previous.depth + 1
    payload, compression = _compressed(body, gzip_threshold)
    stored = StoredCheckpoint(digest, len(canonical), payload, compression, delta_of)
    return stored, Restored(digest, state, canonical, depth)


def _delta(previous: Restored, state: dict[str, Any], canonical: bytes) -> bytes | None:
    patch = diff(previous.state, state)
    if patch is None:
        return None
    try:
        if canonical_json(apply_patch(previous.state, patch)) != canonical:
            return None  # e.g. 1.0 against 1: not worth reasoning about, store it whole
        return canonical_json(patch)
    except (rfc8785.CanonicalizationError, ValueError, TypeError):
        return None


def _compressed(body: bytes, threshold: int) -> tuple[bytes, Compression]:
    if len(body) <= threshold:
        return body, "none"
    packed = gzip.compress(body, compresslevel=6, mtime=0)
    return (packed, "gzip") if len(packed) < len(body) else (body, "none")


def restore(chain: Sequence[StoredCheckpoint], *,
            max_bytes: int = DEFAULT_MAX_STATE_BYTES) -> Restored:
    """The state of `chain[-1]`, from `chain`: a checkpoint stored whole followed by
    the deltas leading to the last one, each the delta of the one before. Every
    state on the way is checked against its hash (E3904 when one does not match)."""
    if not chain or chain[0].delta_of is not None:
        raise CheckpointError("Checkpoint corrupted: its chain does not start with a "
                              "checkpoint stored whole", code="E3904")
    restored: Restored | None = None
    for depth, stored in enumerate(chain):
        body = _inflate(stored, max_bytes)
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise _corrupt(stored, f"not JSON: {error}") from error
        if restored is not None:
            if stored.delta_of != restored.state_hash:
                raise _corrupt(stored, "it is not a delta of the checkpoint before it")
            value = apply_patch(restored.state, value)
        if not isinstance(value, dict):
            raise _corrupt(stored, "its state is not a JSON object")
        canonical = canonical_json(value)
        if state_hash(canonical) != stored.state_hash:
            raise _corrupt(stored, "its state does not match its hash")
        restored = Restored(stored.state_hash, value, canonical, depth)
    assert restored is not None
    return restored


def _inflate(stored: StoredCheckpoint, max_bytes: int) -> bytes:
    """The stored body, decompressed and never past `max_bytes` (a gzip bomb stops)."""
    if stored.compression == "none":
        return stored.payload
    try:
        inflater = zlib.decompressobj(wbits=31)
        body = inflater.decompress(stored.payload, max_bytes + 1)
    except zlib.error as error:
        raise _corrupt(stored, f"not gzip: {error}") from error
    if len(body) > max_bytes or not inflater.eof:
        raise _corrupt(stored, f"it inflates past {max_bytes} bytes or is cut short")
    return body


def _corrupt(stored: StoredCheckpoint, why: str) -> CheckpointError:
    return CheckpointError(f"Checkpoint corrupted: {stored.state_hash}: {why}", code="E3904",
                           details={"state_hash": stored.state_hash})
