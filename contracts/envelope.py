"""The CloudEvent envelope around a contract, independent of any transport.

Ids of derived events are deterministic: ``uuid5(EVENT_ID_NAMESPACE, "<causation
id>:<step>")``, so a redelivered input yields the same output id and consumers can
de-duplicate on it. Nothing here reads a clock: `time` is always passed in.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import lru_cache
from typing import Final

from contracts.events import EventData

EVENT_ID_NAMESPACE: Final = uuid.UUID("6f1f5d3e-2c9a-5b7e-9d41-7a0c3e8b1f25")
"""Fixed namespace of derived event ids; changing it changes every derived id."""

CORE_ATTRIBUTES: Final[frozenset[str]] = frozenset(
    {"id", "source", "type", "specversion", "subject", "time", "datacontenttype",
     "dataschema", "data", "data_base64", "correlationid", "causationid", "partitionkey"}
)
"""Names an extension must not take: CloudEvent attributes and the required extensions."""

_EXTENSION_NAME = re.compile(r"^[a-z0-9]+$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """One CloudEvent: attributes, the required toolexec extensions and typed data.

    `extensions` holds the optional extensions (``captoken``, ``traceparent``...);
    ``correlationid``, ``causationid`` and ``partitionkey`` are fields of their own.
    """

    id: str
    type: str
    source: str
    subject: str | None = None
    time: datetime
    data: EventData
    correlationid: str
    causationid: str | None = None
    partitionkey: str
    extensions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if _plainly_valid(self):  # every envelope is checked: the usual case, quickly
            return
        problems = envelope_problems(self)
        if problems:
            raise ValueError("invalid envelope: " + "; ".join(problems))


_FIELD_SETTERS: Final = tuple(Envelope.__dict__[f.name].__set__ for f in fields(Envelope))


def checked_envelope(*values: object) -> Envelope:
    """The envelope of `values` (every field, in declaration order: id, type, source,
    subject, time, data, correlationid, causationid, partitionkey, extensions), built
    without `Envelope`'s own checks: only for a caller that has made each check of
    `_plainly_valid` itself, `plain_optionals` among them (the Kafka decoder:
    `Envelope(...)` cost it more than the rest of an envelope's attributes together)."""
    env = object.__new__(Envelope)
    for assign, value in zip(_FIELD_SETTERS, values, strict=True):
        assign(env, value)
    return env


def _plainly_valid(env: Envelope) -> bool:
    """True only when `envelope_problems(env)` is empty (False may still be valid:
    then the full check decides)."""
    return bool(
        type(env.id) is str and env.id and type(env.type) is str and env.type
        and type(env.source) is str and env.source
        and type(env.correlationid) is str and env.correlationid
        and type(env.partitionkey) is str and env.partitionkey
        and plain_optionals(env.subject, env.causationid, env.extensions)
        and isinstance(env.time, datetime) and env.time.utcoffset() is not None
        and isinstance(env.data, EventData) and env.type == env.data.EVENT_TYPE)


def plain_optionals(subject: object, causationid: object, extensions: object,
                    names: frozenset[str] | None = None) -> bool:
    """True when the optional fields are as `Envelope` takes them, plainly: `subject`
    and `causationid` None or non-empty `str`, `extensions` a `dict` of `str` values
    whose names are among `names` (None: any name an extension may take; a caller's
    `names` must all be such names). False may still be valid: the full check decides.
    Shared by `Envelope` and the Kafka decoder, which builds envelopes without it
    (`checked_envelope`) and passes the names toolexec writes."""
    if not ((subject is None or (type(subject) is str and subject != ""))
            and (causationid is None or (type(causationid) is str and causationid != ""))
            and type(extensions) is dict):
        return False
    if not extensions:
        return True
    if names is not None:
        return extensions.keys() <= names and all(type(v) is str for v in extensions.values())
    return all(type(name) is str and type(value) is str and _allowed_extension(name)
               for name, value in extensions.items())


@lru_cache(maxsize=256)
def _allowed_extension(name: str) -> bool:
    return _EXTENSION_NAME.match(name) is not None and name not in CORE_ATTRIBUTES


def envelope_problems(env: Envelope) -> list[str]:
    """Every reason `env` is not a valid toolexec CloudEvent (empty when it is)."""
    problems = [
        f"{name} must be a non-empty string"
        for name in ("id", "type", "source", "correlationid", "partitionkey")
        if not isinstance(getattr(env, name), str) or not getattr(env, name)
    ]
    for name in ("causationid", "subject"):
        value = getattr(env, name)
        if value is not None and (not isinstance(value, str) or not value):
            problems.append(f"{name} must be None or a non-empty string")
    if not isinstance(env.time, datetime) or env.time.utcoffset() is None:
        problems.append("time must be a timezone-aware datetime")
    if not isinstance(env.data, EventData):
        problems.append("data must be a contracts.events model")
    elif env.type != env.data.EVENT_TYPE:
        problems.append(f"type {env.type!r} does not match data {env.data.EVENT_TYPE!r}")
    if not isinstance(env.extensions, dict):
        return [*problems, "extensions must be a dict of strings"]
    for name, value in env.extensions.items():
        if not isinstance(name, str) or not _EXTENSION_NAME.match(name) or name in CORE_ATTRIBUTES:
            problems.append(f"extension name {name!r} is not allowed")
        elif not isinstance(value, str):
            problems.append(f"extension {name!r} must be a string")
    return problems


def derived_event_id(causation_id: str, step: str) -> str:
    """Deterministic id of the event that `step` derives from event `causation_id`.

    Use a distinct step per output (e.g. ``"execute.started.2"`` per attempt): two
    outputs of one input with the same step would share an id and one would be
    dropped as a duplicate.
    """
    return str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{causation_id}:{step}"))


def new_envelope(
    data: EventData,
    *,
    source: str,
    partitionkey: str,
    correlationid: str,
    time: datetime,
    causationid: str | None = None,
    id: str | None = None,
    extensions: Mapping[str, str] | None = None,
    subject: str | None = None,
) -> Envelope:
    """Wrap `data` in an envelope; the type comes from the model.

    Without `subject`, an event about one tool (data with a `tool_id`) gets that tool
    id as its CloudEvents `subject`, so consumers can filter on a header without
    parsing the data. Without `id`, the id is ``derived_event_id(causationid, data.EVENT_TYPE)``; an
    event with no cause (a new request, a publication) must be given its id.
    """
    if id is None:
        if causationid is None:
            raise ValueError("id is required for an event without causationid")
        id = derived_event_id(causationid, data.EVENT_TYPE)
    return Envelope(
        id=id,
        type=data.EVENT_TYPE,
        source=source,
        time=time,
        data=data,
        correlationid=correlationid,
        partitionkey=partitionkey,
        causationid=causationid,
        subject=subject if subject is not None else subject_of(data),
        extensions=dict(extensions or {}),
    )


def subject_of(data: EventData) -> str | None:
    """The CloudEvents `subject` of `data`: its tool id when it names one."""
    tool_id = getattr(data, "tool_id", None)
    return tool_id if isinstance(tool_id, str) and tool_id else None
