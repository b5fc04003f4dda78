"""Checkpoint states as stored: canonical hash, deltas, compression, the cap, and
restoring a chain with every link checked."""

from __future__ import annotations

import dataclasses
import gzip
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.canonical_json import canonical_json
from domain.checkpoints import (
    GZIP_THRESHOLD,
    MAX_DELTA_CHAIN,
    CheckpointError,
    StoredCheckpoint,
    encode_checkpoint,
    restore,
    state_hash,
)


def chain_of(states: list[dict[str, Any]]) -> list[StoredCheckpoint]:
    """Each state stored after the one before, as one run stores them."""
    stored, previous = [], None
    for state in states:
        checkpoint, previous = encode_checkpoint(state, previous)
        stored.append(checkpoint)
    return stored


def restorable(chain: list[StoredCheckpoint], index: int) -> list[StoredCheckpoint]:
    """The links `restore` needs for chain[index]: back to the last whole one."""
    start = index
    while chain[start].delta_of is not None:
        start -= 1
    return chain[start:index + 1]


def test_a_state_is_named_by_the_hash_of_its_canonical_json() -> None:
    stored, _ = encode_checkpoint({"b": 1, "a": [1.0, "x"]}, None)
    assert stored.state_hash == state_hash(b'{"a":[1,"x"],"b":1}')
    assert stored.size == len(b'{"a":[1,"x"],"b":1}')
    assert (stored.compression, stored.delta_of) == ("none", None)


def test_large_states_are_gzipped_and_small_ones_are_not() -> None:
    big = {"rows": [{"id": i, "name": f"row {i}", "tags": ["a", "b"]} for i in range(200)]}
    stored, _ = encode_checkpoint(big, None)
    assert stored.compression == "gzip" and stored.size > GZIP_THRESHOLD
    assert stored.size / stored.stored_size > 2.5  # repetitive state compresses well
    assert gzip.decompress(stored.payload) == canonical_json(big)
    small, _ = encode_checkpoint({"done": 1}, None)
    assert small.compression == "none"


def test_a_small_change_is_stored_as_a_delta_and_a_large_one_whole() -> None:
    base = {"done": 1, "big": "x" * 500}
    first, previous = encode_checkpoint(base, None)
    delta, _ = encode_checkpoint({"done": 2, "big": "x" * 500}, previous)
    assert delta.delta_of == first.state_hash and delta.stored_size < 20
    whole, _ = encode_checkpoint({"other": "y" * 500}, previous)
    assert whole.delta_of is None


def test_deltas_stop_after_the_longest_chain() -> None:
    states = [{"done": n, "big": "x" * 500} for n in range(MAX_DELTA_CHAIN + 3)]
    chain = chain_of(states)
    assert chain[0].delta_of is None and all(c.delta_of for c in chain[1:MAX_DELTA_CHAIN + 1])
    assert chain[MAX_DELTA_CHAIN + 1].delta_of is None


def test_a_state_past_the_cap_is_refused_with_e3906_naming_the_cap() -> None:
    with pytest.raises(CheckpointError) as refused:
        encode_checkpoint({"blob": "x" * 100}, None, max_bytes=64)
    assert refused.value.code == "E3906" and "64 bytes" in refused.value.message
    with pytest.raises(CheckpointError) as not_object:
        encode_checkpoint([1, 2], None)  # type: ignore[arg-type]
    assert not_object.value.code == "E3906"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=4), max_leaves=30)
states = st.dictionaries(st.text(max_size=4), json_values, max_size=6)


@settings(max_examples=150)
@given(st.lists(states, min_size=1, max_size=8))
def test_every_checkpoint_of_a_run_restores_to_its_state(run: list[dict[str, Any]]) -> None:
    chain = chain_of(run)
    for index, state in enumerate(run):
        restored = restore(restorable(chain, index))
        assert restored.canonical == canonical_json(state)
        assert restored.state_hash == chain[index].state_hash


def test_a_tampered_link_is_refused_with_e3904() -> None:
    chain = chain_of([{"done": 1, "big": "x" * 500}, {"done": 2, "big": "x" * 500}])
    tampered = dataclasses.replace(chain[0], payload=chain[0].payload.replace(b"x", b"y"))
    with pytest.raises(CheckpointError) as corrupt:
        restore([tampered, chain[1]])
    assert corrupt.value.code == "E3904"
    with pytest.raises(CheckpointError):
        restore([chain[1]])  # a delta without its base


def test_a_gzip_bomb_is_not_inflated_past_the_cap() -> None:
    bomb = gzip.compress(b'{"a":"' + b"x" * 10_000_000 + b'"}')
    stored = StoredCheckpoint(state_hash(b"{}"), 2, bomb, "gzip", None)
    with pytest.raises(CheckpointError) as corrupt:
        restore([stored], max_bytes=1024)
    assert corrupt.value.code == "E3904"
