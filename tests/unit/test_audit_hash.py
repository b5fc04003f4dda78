"""The audit chain hash is sha256(prev hash || RFC 8785 JSON of the record)."""

from __future__ import annotations

import hashlib

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from projections.audit_document import GENESIS, HASHED_COLUMNS, chain_hash


def test_chain_hash_is_sha256_over_the_canonical_record() -> None:
    columns = {"topic": "t", "partition": 0, "offset": 7, "event_id": "e", "type": "x.y",
               "time": "2026-01-01T00:00:00.000000Z", "invocation_id": None,
               "tool_id": "hello", "redactions": 2}
    document = {"data": {"a": 1.5, "b": [None, True, "é\n"]}, "id": "e", "z": 100.0}
    expected = hashlib.sha256(GENESIS.encode() + rfc8785.dumps(
        {**{name: columns[name] for name in HASHED_COLUMNS}, "document": document})).hexdigest()
    assert chain_hash(GENESIS, columns, document) == expected


_column_values = st.one_of(st.none(), st.text(), st.integers(-(2**60), 2**60), st.booleans(),
                           st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=300)
@given(st.fixed_dictionaries({name: _column_values for name in HASHED_COLUMNS}),
       st.dictionaries(st.text(max_size=5), st.one_of(st.none(), st.text(), st.integers(
           -(2**40), 2**40)), max_size=4))
def test_chain_hash_matches_the_reference_for_any_column_values(
        columns: dict[str, object], document: dict[str, object]) -> None:
    """The columns' fast path (orjson) gives the reference's bytes, and any value it
    does not take (big integers, floats, booleans, lone surrogates) goes to the
    reference, which refuses what it cannot encode."""
    reference = {**columns, "document": document}
    try:
        expected = hashlib.sha256(GENESIS.encode() + rfc8785.dumps(reference)).hexdigest()
    except rfc8785.CanonicalizationError:
        with pytest.raises(rfc8785.CanonicalizationError):
            chain_hash(GENESIS, columns, document)
        return
    assert chain_hash(GENESIS, columns, document) == expected
