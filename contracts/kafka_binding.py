"""CloudEvents 1.0 Kafka protocol binding for toolexec envelopes.

Records are written in *binary* content mode: attributes as ``ce_*`` headers
(``content-type`` for ``datacontenttype``), data as JSON in the value, key = the
``partitionkey`` extension. `decode` also accepts *structured* mode
(``content-type: application/cloudevents+json``).

The cloudevents SDK is the reference (`encode_with_sdk`, `decode_with_sdk`); the
hot-path `encode` / `decode` build and read the same bytes directly, and the tests
hold both pairs to identical results. Whatever arrives, `decode` returns an
`Envelope` or raises `UndecodableRecord` (E3004) — never another exception.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka, to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from pydantic import ValidationError

from contracts import topics
from contracts.envelope import Envelope, checked_envelope, plain_optionals
from contracts.errors import ErrorInfo
from contracts.events import EVENT_MODELS, EventData, dataschema_uri

CE_PREFIX: Final = "ce_"
CONTENT_TYPE_HEADER: Final = "content-type"
DATA_CONTENT_TYPE: Final = "application/json"
STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"
SPECVERSION: Final = "1.0"

_FORMAT: Final = JSONFormat()
_BYTES: Final = (bytes, bytearray, memoryview)
_DATASCHEMAS: Final = {t: dataschema_uri(t, m.SCHEMA_VERSION) for t, m in EVENT_MODELS.items()}
_READABLE_DATASCHEMAS: Final = {
    t: frozenset(dataschema_uri(t, v) for v in (m.SCHEMA_VERSION, *m.READABLE_SCHEMA_VERSIONS))
    for t, m in EVENT_MODELS.items()}
_KNOWN_HEADERS: Final = {
    **{CE_PREFIX + name: name for name in (
        "specversion", "id", "source", "type", "subject", "time", "dataschema",
        "correlationid", "causationid", "partitionkey", "captoken", "traceparent",
        "tracestate", "sigkid", "sigset", "sig")},
    CONTENT_TYPE_HEADER: "datacontenttype"}
"""Lower-case header names toolexec writes -> attribute (the decoder's fast lookup;
``sig*``: the pipeline's fact signature, `contracts.fact_signature`)."""
_WRITTEN_HEADERS: Final[dict[str, str | None]] = {**_KNOWN_HEADERS, "toolexec-resume": None}
"""`_KNOWN_HEADERS` and the transport header the pipeline adds to its facts (no
attribute: the decoder ignores it, as every header but ``ce_*`` and ``content-type``)."""
WRITTEN_HEADER_NAMES: Final = frozenset(_WRITTEN_HEADERS)
"""Every header name toolexec writes on a record."""
_ENVELOPE_ATTRIBUTES: Final = frozenset(
    {"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema",
     "correlationid", "causationid", "partitionkey"}
)
WRITTEN_EXTENSIONS: Final = frozenset(_KNOWN_HEADERS.values()) - _ENVELOPE_ATTRIBUTES
"""The extensions toolexec writes (``captoken``, ``traceparent``, the signature's...)."""
_FIELD_NAMES: Final = tuple(f.name for f in fields(Envelope))


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """What a producer sends: key, value and headers in order."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


class UndecodableRecord(Exception):
    """A record that is not a valid toolexec CloudEvent; `error` is its E3004 value."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.error = ErrorInfo(code="E3004", message=message, details=details)


# --- encoding ------------------------------------------------------------------------


def _attributes(env: Envelope) -> dict[str, Any]:
    """CloudEvent attributes of `env`, in header order (shared by both encoders)."""
    attrs: dict[str, Any] = {"specversion": SPECVERSION, "id": env.id, "source": env.source,
                             "type": env.type}
    if env.subject is not None:
        attrs["subject"] = env.subject
    attrs["time"] = env.time.astimezone(UTC)
    attrs["datacontenttype"] = DATA_CONTENT_TYPE
    attrs["dataschema"] = dataschema_uri(env.type, env.data.SCHEMA_VERSION)
    attrs["correlationid"] = env.correlationid
    if env.causationid is not None:
        attrs["causationid"] = env.causationid
    attrs["partitionkey"] = env.partitionkey
    for name in sorted(env.extensions):
        attrs[name] = env.extensions[name]
    return attrs


def _format_time(value: datetime) -> str:
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def encode(env: Envelope) -> KafkaRecord:
    """`env` as a binary-mode Kafka record (hot path; same bytes as `encode_with_sdk`)."""
    headers: list[tuple[str, bytes]] = []
    for name, value in _attributes(env).items():
        if name == "datacontenttype":
            headers.append((CONTENT_TYPE_HEADER, value.encode()))
        elif name == "time":
            headers.append(("ce_time", _format_time(value).encode()))
        else:
            headers.append((CE_PREFIX + name, value.encode()))
    return KafkaRecord(env.partitionkey.encode(), env.data.model_dump_json().encode(), headers)


class RecordSender(Protocol):
    """What sends a record: an aiokafka producer."""

    async def send_and_wait(self, topic: str, value: bytes | None = None,
                            key: bytes | None = None, partition: int | None = None,
                            timestamp_ms: int | None = None,
                            headers: Any = None) -> Any: ...


async def send_event(producer: RecordSender, envelope: Envelope, *,
                     record: KafkaRecord | None = None, partition: int | None = None) -> Any:
    """Send `envelope` to its type's topic (`topics.TOPIC_OF_TYPE`), encoded, or as
    `record` when it is already (e.g. a signed fact); returns the record's metadata."""
    record = record or encode(envelope)
    return await producer.send_and_wait(topics.TOPIC_OF_TYPE[envelope.type], record.value,
                                        key=record.key, headers=list(record.headers),
                                        partition=partition)


def encode_with_sdk(env: Envelope) -> KafkaRecord:
    """`env` as a binary-mode Kafka record, built by the cloudevents SDK (reference)."""
    event = CloudEvent(_attributes(env), env.data.model_dump_json().encode())
    message = to_binary(event, _FORMAT)
    return KafkaRecord(_as_bytes(message.key), message.value, list(message.headers.items()))


def encode_structured(env: Envelope) -> KafkaRecord:
    """`env` as a structured-mode record (one JSON document), built by the SDK."""
    event = CloudEvent(_attributes(env), env.data.model_dump(mode="json"))
    message = to_structured(event, _FORMAT)
    return KafkaRecord(_as_bytes(message.key), message.value, list(message.headers.items()))


def to_document(env: Envelope) -> bytes:
    """`env` as one CloudEvents JSON document (structured mode), for storage: the
    attributes and the data's own JSON spliced in (hot path; the SDK's structured
    encoder, `encode_structured`, makes a document that reads back the same)."""
    attrs = _attributes(env)
    attrs["time"] = _format_time(attrs["time"])
    head = json.dumps(attrs, separators=(",", ":"), ensure_ascii=False)
    return f'{head[:-1]},"data":{env.data.model_dump_json()}}}'.encode()


def from_document(document: bytes) -> Envelope:
    """The envelope stored by `to_document`; raises only `UndecodableRecord`."""
    return decode(None, document, [(CONTENT_TYPE_HEADER, STRUCTURED_CONTENT_TYPE.encode())])


def _as_bytes(key: str | bytes | None) -> bytes:
    return key.encode() if isinstance(key, str) else (key or b"")


# --- decoding ------------------------------------------------------------------------


def decode(key: bytes | None, value: bytes | None,
           headers: Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None) -> Envelope:
    """Read a binary- or structured-mode record; raises only `UndecodableRecord`.

    An empty or absent key falls back to the ``ce_partitionkey`` header; otherwise the
    key is the partition key (as in the SDK). Headers other than ``ce_*`` and
    ``content-type`` are ignored; a repeated CloudEvent header is refused.
    """
    return _guarded(_decode_fast, key, value, headers)


def decode_with_sdk(key: bytes | None, value: bytes | None,
                    headers: Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None
                    ) -> Envelope:
    """Like `decode`, parsing through the cloudevents SDK (reference, slower)."""
    return _guarded(_decode_sdk, key, value, headers)


Decoder = Callable[[bytes | None, bytes, Any], Envelope]


def _guarded(decoder: Decoder, key: Any, value: Any, headers: Any) -> Envelope:
    try:
        if key is not None and not isinstance(key, _BYTES):
            raise UndecodableRecord("record key is not bytes")
        if value is not None and not isinstance(value, _BYTES):
            raise UndecodableRecord("record value is not bytes")
        if type(headers) is not list and isinstance(headers, Mapping):  # list: no ABC check
            headers = headers.items()
        # An empty key is no key (some clients send b"" for None): fall back to the header.
        return decoder(bytes(key) if key else None, bytes(value or b""), headers)
    except UndecodableRecord:
        raise
    except Exception as exc:  # boundary: anything unexpected is bad input, kept as cause
        raise UndecodableRecord("record is not a CloudEvent",
                                reason=f"{type(exc).__name__}: {exc}"[:500]) from exc


def header_type(headers: Any) -> str | None:
    """The record's `ce_type` header, read without decoding the record (to skip records
    of other types cheaply); None for a record without one (structured mode)."""
    for name, value in headers or ():
        if name == "ce_type":
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return None


def _header_map(headers: Any) -> dict[str, bytes]:
    """CloudEvent headers (``ce_*``, ``content-type``) by lower-case name, for the SDK."""
    found: dict[str, bytes] = {}
    for name, raw in headers or ():
        name = (name.decode() if isinstance(name, bytes) else name).lower()
        if name[:3] != CE_PREFIX and name != CONTENT_TYPE_HEADER:
            continue
        if name in found:
            raise UndecodableRecord("header repeated", header=name)
        if not isinstance(raw, _BYTES):
            raise UndecodableRecord("header value is not bytes", header=name)
        found[name] = bytes(raw)
    return found


def _check_structured(content_type: str | None) -> None:
    if content_type is None or _media_type(content_type) != STRUCTURED_CONTENT_TYPE:
        raise UndecodableRecord("record is not a CloudEvent: no ce_ headers and no "
                                f"{STRUCTURED_CONTENT_TYPE} content-type",
                                content_type=(content_type or "")[:200])


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _decode_fast(key: bytes | None, value: bytes, headers: Any) -> Envelope:
    attrs = _written_attributes(headers)
    if attrs is not None:
        binary = len(attrs) > ("datacontenttype" in attrs)
    else:
        attrs, binary = _header_attributes(headers)
    if binary:
        data: Any = value
    else:
        _check_structured(attrs.get("datacontenttype"))
        attrs = _structured_attributes(value)
        data = attrs.pop("data", None)
        encoded = attrs.pop("data_base64", None)
        if data is None and isinstance(encoded, str):
            data = _b64(encoded)
    if key is not None:
        attrs["partitionkey"] = _text(key, "key")
    return _envelope(attrs, data)


def _written_attributes(headers: Any) -> dict[str, str] | None:
    """The attributes of headers exactly as toolexec writes them (known lower-case
    names, signed facts' included, UTF-8 values, none repeated), in one comprehension;
    None for any other headers, which `_header_attributes` reads (and refuses, when
    they are wrong)."""
    if type(headers) is not list and type(headers) is not tuple:
        return None
    try:
        attrs: dict[Any, str] = {_WRITTEN_HEADERS[name]: raw.decode("utf-8")
                                 for name, raw in headers}
    except (KeyError, TypeError, AttributeError, ValueError):
        return None
    if len(attrs) != len(headers):
        return None
    attrs.pop(None, None)  # the transport header, no attribute
    return attrs


def _header_attributes(headers: Any) -> tuple[dict[str, Any], bool]:
    """(attributes, binary mode?) of any headers, checked one by one."""
    # Header names as toolexec writes them are looked up directly; others (bytes,
    # upper case, unknown extensions) take the general path.
    attrs: dict[str, Any] = {}
    binary = False
    for name, raw in headers or ():
        attribute = _KNOWN_HEADERS.get(name) if type(name) is str else None
        if attribute is not None:
            binary = binary or name != CONTENT_TYPE_HEADER
        else:
            name = (name.decode() if isinstance(name, bytes) else name).lower()
            if name[:3] == CE_PREFIX:
                attribute = name[3:]
                binary = True
            elif name == CONTENT_TYPE_HEADER:
                attribute = "datacontenttype"
            else:
                continue
        if attribute in attrs:
            raise UndecodableRecord("header repeated", header=name)
        if type(raw) is not bytes:
            if not isinstance(raw, _BYTES):
                raise UndecodableRecord("header value is not bytes", header=name)
            raw = bytes(raw)
        attrs[attribute] = _text(raw, name)
    return attrs, binary


def _decode_sdk(key: bytes | None, value: bytes, headers: Any) -> Envelope:
    header_map = _header_map(headers)
    if not any(name.startswith(CE_PREFIX) for name in header_map):
        content_type = header_map.get(CONTENT_TYPE_HEADER)
        _check_structured(None if content_type is None else _text(content_type, "content-type"))
    try:
        message = KafkaMessage(headers=header_map, key=key, value=value)
        event = from_kafka(message, _FORMAT, _strict_cloudevent)
    except UndecodableRecord:
        raise
    except Exception as exc:  # boundary: the SDK's many failure types are all E3004
        raise UndecodableRecord("record is not a valid CloudEvent",
                                reason=f"{type(exc).__name__}: {exc}"[:500]) from exc
    return _envelope(dict(event.get_attributes()), event.get_data())


def _strict_cloudevent(attributes: dict[str, Any], data: Any) -> CloudEvent:
    """The SDK's v1.0 event, minus its habit of inventing a missing id (uuid4) or time
    (now): a record without them is malformed, not new."""
    for name in ("id", "time"):
        if name not in attributes:
            raise UndecodableRecord(f"missing attribute {name}", attribute=name)
    return CloudEvent(attributes, data)


def _text(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UndecodableRecord("not UTF-8 text", header=where) from exc


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UndecodableRecord("data_base64 is not base64") from exc


def _structured_attributes(value: bytes) -> dict[str, Any]:
    try:
        document = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise UndecodableRecord("structured CloudEvent is not JSON", reason=str(exc)[:200]) from exc
    if not isinstance(document, dict):
        raise UndecodableRecord("structured CloudEvent is not a JSON object")
    return document


def _envelope(attrs: dict[str, Any], data: Any) -> Envelope:
    """Check the attributes, validate the data against its model, build the envelope."""
    if attrs.get("specversion") != SPECVERSION:
        raise UndecodableRecord("specversion must be 1.0", attribute="specversion")
    event_type = _required(attrs, "type")
    model = EVENT_MODELS.get(event_type)
    if model is None:
        raise UndecodableRecord(f"unknown event type {event_type[:100]!r}", attribute="type",
                                known=sorted(EVENT_MODELS))
    content_type = attrs.get("datacontenttype")
    if content_type is not None and _media_type(str(content_type)) != DATA_CONTENT_TYPE:
        raise UndecodableRecord("datacontenttype must be application/json",
                                attribute="datacontenttype")
    schema = attrs.get("dataschema")
    expected = _DATASCHEMAS[event_type]
    if schema is not None and schema not in _READABLE_DATASCHEMAS[event_type]:
        raise UndecodableRecord("unsupported dataschema", attribute="dataschema",
                                expected=expected)
    extensions = ({} if attrs.keys() <= _ENVELOPE_ATTRIBUTES  # most records have none
                  else {n: v for n, v in attrs.items() if n not in _ENVELOPE_ATTRIBUTES})
    try:
        values = (_required(attrs, "id"), event_type, _required(attrs, "source"),
                  attrs.get("subject"), _time(attrs.get("time")), _validate(model, data),
                  _required(attrs, "correlationid"), attrs.get("causationid"),
                  _required(attrs, "partitionkey"), extensions)
        if plain_optionals(values[3], values[7], extensions, WRITTEN_EXTENSIONS):
            return checked_envelope(*values)  # every check of `Envelope` made above
        return Envelope(**dict(zip(_FIELD_NAMES, values, strict=True)))
    except ValueError as exc:
        raise UndecodableRecord(str(exc)[:500]) from exc


def _required(attrs: Mapping[str, Any], name: str) -> str:
    value = attrs.get(name)
    if not isinstance(value, str) or not value:
        raise UndecodableRecord(f"missing attribute {name}", attribute=name)
    return value


def _time(value: Any) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise UndecodableRecord("time is not RFC 3339", attribute="time") from exc
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise UndecodableRecord("time missing or without offset", attribute="time")
    return value.astimezone(UTC)


def _validate(model: type[EventData], data: Any) -> EventData:
    try:
        if isinstance(data, bytes):
            if not data:
                raise UndecodableRecord("event has no data", type=model.EVENT_TYPE)
            # the validator itself: `model_validate_json` adds ~2 µs of Python
            return model.__pydantic_validator__.validate_json(data)
        if not isinstance(data, dict):
            raise UndecodableRecord("event data is not a JSON object", type=model.EVENT_TYPE)
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise UndecodableRecord(
            f"data does not match {model.EVENT_TYPE} ({len(errors)} error(s))",
            type=model.EVENT_TYPE,
            errors=[{"loc": [str(p) if not isinstance(p, int) else p for p in e["loc"]],
                     "msg": e["msg"], "type": e["type"]} for e in errors],
        ) from exc
