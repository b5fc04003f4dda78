"""A checkpoint's state read back from the checkpoint store (the CheckpointStore
port): whole, or reassembled from the deltas leading to it, each link checked."""

from __future__ import annotations

from consumers.ports import CheckpointStore
from domain.checkpoints import (
    MAX_DELTA_CHAIN,
    CheckpointError,
    Restored,
    StoredCheckpoint,
    restore,
)


async def load_state(store: CheckpointStore, state_hash: str) -> Restored:
    """The state of checkpoint `state_hash`, reassembled from the deltas leading to it
    and checked link by link (E3903 when a link is missing, E3904 when corrupted)."""
    chain: list[StoredCheckpoint] = []
    wanted: str | None = state_hash
    while wanted is not None:
        if len(chain) > MAX_DELTA_CHAIN:
            raise CheckpointError(f"Checkpoint corrupted: {state_hash} is more than "
                                  f"{MAX_DELTA_CHAIN} deltas away from a whole state",
                                  code="E3904", details={"state_hash": state_hash})
        stored = await store.get(wanted)
        if stored is None:
            raise CheckpointError(f"Checkpoint not found: {wanted} is not in the checkpoint "
                                  "store", code="E3903", details={"state_hash": wanted})
        chain.append(stored)
        wanted = stored.delta_of
    return restore(chain[::-1])
