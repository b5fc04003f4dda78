"""Audit records as pure values: the redacted CloudEvent document and its hash chain.

The document is a CloudEvents 1.0 JSON (structured mode) with its `data` and
`subject` redacted (domain.redaction: secret field names, e-mail, phone, card, SSN,
IP). The capability token never enters it: only its subject and jti do, as the
extensions ``capsubject`` and ``capjti``. File contents of `tool.published` are
left out (each file's sha256 stays; the log and the executors' store hold the bytes).

Each record's hash is ``sha256(prev_hash || RFC 8785 JSON of every other column of
the record, the document parsed)``, so editing any stored value breaks it; the first
record of a partition chains from `GENESIS`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from rfc8785 import CanonicalizationError

from contracts.envelope import Envelope
from contracts.events import EVENT_MODELS, dataschema_uri
from domain.canonical_json import canonical_json, canonical_json_encoded
from domain.redaction import (
    is_sensitive_field,
    redact,
    redact_document,
    redact_planned,
    redact_text,
)
from domain.secret_scrub import REDACTED
from projections.audit_plan import PLANS
from projections.tables import iso

GENESIS: Final = "0" * 64
KEPT_EXTENSIONS: Final = frozenset({"traceparent", "tracestate"})
_SAFE_INT: Final = 2**53 - 1
_DATASCHEMAS: Final = {model: dataschema_uri(model.EVENT_TYPE, model.SCHEMA_VERSION)
                       for model in EVENT_MODELS.values()}


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row's values, before or after storage."""

    topic: str
    partition: int
    offset: int
    event_id: str
    type: str
    time: str
    invocation_id: str | None
    tool_id: str | None
    document: str
    redactions: int
    prev_hash: str
    hash: str

    def as_row(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset,
                "event_id": self.event_id, "type": self.type, "time": self.time,
                "invocation_id": self.invocation_id, "tool_id": self.tool_id,
                "document": self.document, "redactions": self.redactions,
                "prev_hash": self.prev_hash, "hash": self.hash}


def captoken_identity(envelope: Envelope) -> tuple[str | None, str | None]:
    """(sub, jti) read from the ``captoken`` extension's JWT payload, unverified: for
    the record only; authorization verifies the token, this never trusts it."""
    token = envelope.extensions.get("captoken")
    if not token:
        return None, None
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return None, None
    if not isinstance(claims, dict):
        return None, None
    sub, jti = claims.get("sub"), claims.get("jti")
    return (sub if isinstance(sub, str) else None), (jti if isinstance(jti, str) else None)


def audit_document(envelope: Envelope) -> tuple[dict[str, Any], int]:
    """The redacted CloudEvent document of `envelope` and how many values were redacted."""
    document, count, _ = _document(envelope)
    return _json_safe(document), count


def _document(envelope: Envelope) -> tuple[dict[str, Any], int, int]:
    """(document, values redacted, how `canonical_json` can encode the document): the
    attributes around the data are text, so the data's encoding is the document's."""
    model = envelope.data  # its serializer called directly: `model_dump(mode="json")`
    data = model.__pydantic_serializer__.to_python(model, mode="json")
    if envelope.type == "tool.published":
        data["files"] = [{k: v for k, v in f.items() if k != "content_b64gz"}
                         for f in data.get("files", [])]
    plan = PLANS.get(type(model))
    # The plan visits only the fields a rule can change; the data is the serializer's
    # own fresh dict, redacted in place.
    redacted_data, count, encoding = (redact_document(data) if plan is None
                                      else redact_planned(data, plan))
    document: dict[str, Any] = {
        "specversion": "1.0", "id": envelope.id, "source": envelope.source,
        "type": envelope.type, "time": iso(envelope.time),
        "datacontenttype": "application/json",
        "dataschema": (_DATASCHEMAS.get(type(model))
                       or dataschema_uri(envelope.type, model.SCHEMA_VERSION)),
        "correlationid": envelope.correlationid, "partitionkey": envelope.partitionkey,
    }
    if envelope.causationid is not None:
        document["causationid"] = envelope.causationid
    if envelope.subject is not None:
        document["subject"], found = redact_text(envelope.subject)  # = redact(a string)
        count += found
    extensions = envelope.extensions
    for name, value in extensions.items():
        if name == "captoken":
            continue
        if name in KEPT_EXTENSIONS:
            document[name] = value
        elif type(value) is str:  # = redact({name: value}), without the walk
            if value and is_sensitive_field(name):
                document[name], count = REDACTED, count + 1
            else:
                document[name], found = redact_text(value)
                count += found
        else:
            kept = redact({name: value})
            document[name], count = kept.value[name], count + kept.count
    if "captoken" in extensions:
        sub, jti = captoken_identity(envelope)
        if sub is not None:
            document["capsubject"] = sub
        if jti is not None:
            document["capjti"] = jti
    document["data"] = redacted_data
    return document, count, encoding


def canonical(value: Any) -> bytes:
    """RFC 8785 canonical JSON bytes of `value`."""
    return canonical_json(value)


HASHED_COLUMNS: Final = ("topic", "partition", "offset", "event_id", "type", "time",
                          "invocation_id", "tool_id", "redactions")


def chain_hash(prev_hash: str, columns: Mapping[str, Any], document: Any) -> str:
    """The hash of one audit record (its `HASHED_COLUMNS` and parsed document) given its
    predecessor's hash."""
    return _chain_hash(prev_hash, columns, canonical(document))


def _chain_hash(prev_hash: str, columns: Mapping[str, Any], document: bytes) -> str:
    return _chained(prev_hash, {name: columns[name] for name in HASHED_COLUMNS}, document)


def _chained(prev_hash: str, values: dict[str, Any], document: bytes) -> str:
    """`_chain_hash` of `values`, which holds the `HASHED_COLUMNS` and nothing else."""
    # "document" sorts before every hashed column name, so the canonical body is the
    # document's canonical text spliced in front of the columns' (no second pass over
    # the document).
    rest = _columns_json(values)
    return hashlib.sha256(b"".join((prev_hash.encode("ascii"), b'{"document":', document,
                                    b",", rest[1:]))).hexdigest()


def _columns_json(values: dict[str, Any]) -> bytes:
    """Canonical JSON of `values` (the `HASHED_COLUMNS`). They are text, NULL or
    small integers, for which orjson with sorted keys writes RFC 8785's bytes: the
    general check (`canonical_json`) is taken only for another value."""
    for value in values.values():
        kind = type(value)
        if not (kind is str or value is None or (kind is int and -_SAFE_INT <= value <= _SAFE_INT)):
            return canonical(values)
    try:
        return orjson.dumps(values, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # a lone surrogate: the reference decides
        return canonical(values)


def audit_values(envelope: Envelope, *, topic: str, partition: int, offset: int,
                 prev_hash: str) -> tuple[Any, ...]:
    """The audit record of one log record, chained after `prev_hash`, as a tuple in
    `AuditEntry`'s field order (pure; no object per record on the rebuild's path)."""
    document, count, encoding = _document(envelope)
    try:
        text = canonical_json_encoded(document, encoding)
    except CanonicalizationError:  # huge integers, NaN: made JSON-safe (rare, slower)
        document = _json_safe(document)
        text = canonical(document)
    fields = envelope.data.__dict__  # = `field_of`, one lookup of the model's values
    invocation_id = fields.get("invocation_id")
    tool_id = fields.get("tool_id")
    columns = {"topic": topic, "partition": partition, "offset": offset,  # HASHED_COLUMNS
               "event_id": envelope.id, "type": envelope.type, "time": document["time"],
               "invocation_id": invocation_id, "tool_id": tool_id, "redactions": count}
    return (topic, partition, offset, envelope.id, envelope.type, document["time"],
            invocation_id, tool_id, text.decode("utf-8"), count, prev_hash,
            _chained(prev_hash, columns, text))


def audit_entry(envelope: Envelope, *, topic: str, partition: int, offset: int,
                prev_hash: str) -> AuditEntry:
    """The audit record of one log record, chained after `prev_hash` (pure)."""
    return AuditEntry(*audit_values(envelope, topic=topic, partition=partition,
                                    offset=offset, prev_hash=prev_hash))


def _json_safe(value: Any) -> Any:
    """Values RFC 8785 can encode: huge integers become text, NaN/inf become null."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) > _SAFE_INT:
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
