"""A fixed log's rebuilt rows, pinned: a faster decode, redaction or audit document must
give byte for byte the rows (audit hash chains included) that the code before it gave.

The log goes through the Kafka binding (encode, then decode, as a rebuild reads it)
and carries what the audit document treats specially: PII and secrets at any depth,
integral and exponent floats, integers beyond 2**53, keys beyond U+FFFF, capability
tokens, tool publications with files. The digests were taken with main's code before
issue 17's second round of CPU cuts; a change that moves them changes the trail.
"""

from __future__ import annotations

import hashlib
from typing import Any

from contracts.envelope import Envelope
from contracts.kafka_binding import decode, encode
from projections.audit_document import GENESIS, audit_values
from projections.bulk_rows import row_tuples
from projections.invocations import invocations_model
from projections.tables import invocations
from tests.projection_events import captoken, invocation, published

PARAMETERS: tuple[dict[str, Any], ...] = (
    {"text": "hi"},
    {"text": "write to bob@example.com or +44 20 7946 0958", "password": "hunter22",
     "weight": 2.0, "nested": {"api_key": "k-123456", "cards": ["4111 1111 1111 1111", "1234"]}},
    {"ip": "10.1.2.3 and 2001:db8::1", "ratio": 1.0, "big": 2**60, "tiny": 1e-7,
     "huge": 1e22, "ssn": "123-45-6789", "note": "Authorization: Bearer abcdefgh12345"},
    {"ключ": "значение", "\U0001d11e": "clef", "list": [1, 2.5, None, True, "call 415-555-2671"],
     "empty": {}, "token": "", "small": 2.5e-8},
)
OUTCOMES = ("completed", "failed", "denied", "completed")
AUDIT_DIGEST = "7c2ea41cd5510443a627250d391e1dfb33467e6d6c06138fe12c4dec43dd4694"
INVOCATIONS_DIGEST = "be765ec87053d0126abf674b82a4d0d6af763061f35a41e05be7ac0f32a406b9"


def _log() -> list[Envelope]:
    events: list[Envelope] = []
    for n in range(24):
        events += invocation(f"inv-{n}", outcome=OUTCOMES[n % 4], start=n * 0.5,
                             token=captoken(f"user-{n}@example.com", f"j{n}") if n % 3 == 0
                             else None, parameters=PARAMETERS[n % len(PARAMETERS)],
                             reports=n % 3, approval=(None, "approve", None, "deny")[n % 4],
                             received=False)  # the log as pinned
        if n % 6 == 0:
            events.append(published(f"tool_{n}", f"1.{n}.0", tags=["a", "ops@example.com"],
                                    description=f"Calls 10.0.0.{n} with password=s3cret{n}"))
    return [_read(e) for e in events]


def _read(env: Envelope) -> Envelope:
    record = encode(env)
    return decode(record.key, record.value, record.headers)


def _audit_digest(log: list[Envelope]) -> str:
    digest = hashlib.sha256()
    heads: dict[int, str] = {}
    offsets: dict[int, int] = {}
    for env in log:
        partition = sum(env.partitionkey.encode()) % 4
        offset = offsets.get(partition, 0)
        row = audit_values(env, topic="toolexec.audit-test", partition=partition, offset=offset,
                           prev_hash=heads.get(partition, GENESIS))
        heads[partition], offsets[partition] = row[-1], offset + 1
        digest.update(repr(row).encode())
    return digest.hexdigest()


def _invocations_digest(log: list[Envelope]) -> str:
    model = invocations_model()
    keyed = [(key, e) for e in log if (key := model.aggregate_of(e)) is not None]
    states = {key: {invocations.name: []} for key, _ in keyed}
    model.fold_all(states, keyed)
    rows = row_tuples(invocations, (row for key in sorted(states)
                                    for row in states[key][invocations.name]))
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def test_the_audit_trail_of_a_fixed_log_is_the_one_pinned() -> None:
    assert _audit_digest(_log()) == AUDIT_DIGEST


def test_the_invocation_rows_of_a_fixed_log_are_the_ones_pinned() -> None:
    assert _invocations_digest(_log()) == INVOCATIONS_DIGEST
