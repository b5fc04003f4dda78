"""The embedded checkpoint store on disk: content-addressed, durable, checked on load."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.adapters.checkpoint_store import FileCheckpointStore
from consumers.steps.checkpoint_restore import load_state
from domain.checkpoints import CheckpointError, encode_checkpoint

pytestmark = pytest.mark.integration

STATES = [{"done": n, "rows": {str(i): f"row {i}" for i in range(40 * n)}} for n in range(1, 5)]


async def stored_run(store: FileCheckpointStore) -> list[str]:
    hashes, previous = [], None
    for state in STATES:
        checkpoint, previous = encode_checkpoint(state, previous)
        await store.put(checkpoint)
        await store.put(checkpoint)  # the same state again: nothing changes
        hashes.append(checkpoint.state_hash)
    return hashes


async def test_every_checkpoint_loads_back_through_its_deltas(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path / "checkpoints")
    hashes = await stored_run(store)
    assert (await store.get(hashes[-1])).delta_of == hashes[-2]  # type: ignore[union-attr]
    for state, state_hash in zip(STATES, hashes, strict=True):
        assert (await load_state(store, state_hash)).state == state
    assert not list((tmp_path / "checkpoints").rglob(".put-*"))  # nothing left aside


async def test_a_missing_or_damaged_checkpoint_is_named(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path / "checkpoints")
    hashes = await stored_run(store)
    with pytest.raises(CheckpointError) as missing:
        await load_state(store, "sha256:" + "0" * 64)
    assert missing.value.code == "E3903"
    with pytest.raises(CheckpointError) as no_hash:
        await load_state(store, "../../etc/passwd")
    assert no_hash.value.code == "E3903"
    whole = hashes[-1]
    while (link := await store.get(whole)) is not None and link.delta_of is not None:
        whole = link.delta_of
    (store.root / whole[7:9] / whole[7:]).write_bytes(b"garbage")
    with pytest.raises(CheckpointError) as corrupt:
        await load_state(store, hashes[-1])
    assert corrupt.value.code == "E3904"
