"""The audit chain hash is sha256(prev hash || RFC 8785 JSON of the record)."""

from __future__ import annotations

import hashlib

import rfc8785

from projections.audit_document import GENESIS, HASHED_COLUMNS, chain_hash


def test_chain_hash_is_sha256_over_the_canonical_record() -> None:
    columns = {"topic": "t", "partition": 0, "offset": 7, "event_id": "e", "type": "x.y",
               "time": "2026-01-01T00:00:00.000000Z", "invocation_id": None,
               "tool_id": "hello", "redactions": 2}
    document = {"data": {"a": 1.5, "b": [None, True, "é\n"]}, "id": "e", "z": 100.0}
    expected = hashlib.sha256(GENESIS.encode() + rfc8785.dumps(
        {**{name: columns[name] for name in HASHED_COLUMNS}, "document": document})).hexdigest()
    assert chain_hash(GENESIS, columns, document) == expected
