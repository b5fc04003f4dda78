"""The checkpoint store: tools' checkpoint states, content-addressed by state_hash.

`consumers.ports.CheckpointStore` is the port (a shared store — an object store, a
database — can replace the embedded one); `FileCheckpointStore` keeps each checkpoint in a file of
its own under the state directory, `root/<aa>/<hex>`: a header line (JSON: the
compression and the delta base) and the stored bytes. A `put` returns once the file
and its folder are on disk (written aside, fsynced, renamed), so a checkpoint is
durable before its event is produced. A state already stored is not written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
from pathlib import Path

import orjson

from domain.checkpoints import CheckpointError, StoredCheckpoint

_HASH = re.compile(r"sha256:([0-9a-f]{64})")
_HEADER_MAX = 512


class FileCheckpointStore:
    """Checkpoints as files under `root` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def put(self, checkpoint: StoredCheckpoint) -> None:
        await asyncio.to_thread(self._put, checkpoint)

    async def get(self, state_hash: str) -> StoredCheckpoint | None:
        return await asyncio.to_thread(self._get, state_hash)

    def _path(self, state_hash: str) -> Path:
        match = _HASH.fullmatch(state_hash)
        if match is None:
            raise CheckpointError(f"Checkpoint not found: {state_hash!r} is no state hash",
                                  code="E3903")
        hexdigest = match.group(1)
        return self.root / hexdigest[:2] / hexdigest

    def _put(self, checkpoint: StoredCheckpoint) -> None:
        path = self._path(checkpoint.state_hash)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        header = orjson.dumps({"size": checkpoint.size, "compression": checkpoint.compression,
                               "delta_of": checkpoint.delta_of})
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".put-")
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(header + b"\n" + checkpoint.payload)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def _get(self, state_hash: str) -> StoredCheckpoint | None:
        try:
            data = self._path(state_hash).read_bytes()
        except FileNotFoundError:
            return None
        head, newline, payload = data.partition(b"\n")
        try:
            if not newline or len(head) > _HEADER_MAX:
                raise ValueError("no header line")
            header = orjson.loads(head)
            compression = header["compression"]
            delta_of = header["delta_of"]
            if compression not in ("none", "gzip") or not (
                    delta_of is None or _HASH.fullmatch(str(delta_of))):
                raise ValueError("unknown compression or delta base")
            return StoredCheckpoint(state_hash, int(header["size"]), payload, compression,
                                    delta_of)
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"Checkpoint corrupted: {state_hash}: unreadable header "
                                  f"({error})", code="E3904",
                                  details={"state_hash": state_hash}) from error
