"""Redaction plans of the contract models: which fields of an event's data the audit
trail's redaction can change (`domain.redaction.redact_planned`).

A plan is compiled once per model from its field types. Left out are the fields whose
validated shape no redaction rule can change and whose JSON needs no canonical
check: booleans, timestamps, enums whose every value the text rules leave alone, and
text held to one of `INERT_PATTERNS`. Numbers are kept only for their encoding.
Free text (ids and versions included: a model only asks them to be non-empty),
parameters, results, maps of arbitrary keys and unions are redacted as the full walk
redacts them; nested models get plans of their own. A field under a sensitive name
is replaced whole, as the full walk does. tests/unit/test_audit_plan.py holds every
model's plan to the full walk on generated events with hostile text in every field.
"""

from __future__ import annotations

import types
from datetime import datetime
from inspect import isclass
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

from pydantic import AwareDatetime, BaseModel
from pydantic.fields import FieldInfo

from contracts.errors import ERROR_CODE_PATTERN
from contracts.events import EVENT_MODELS
from domain.redaction import (
    NUMBER,
    OBJECT,
    OBJECTS,
    SECRET,
    TEXT,
    VALUE,
    Plan,
    is_sensitive_field,
    redact_text,
)

INERT_PATTERNS: Final = frozenset({
    r"^sha256:[0-9a-f]{64}$",
    r"^[0-9a-f]{64}$",
    r"^ed25519:[A-Za-z0-9_-]{43}$",
    r"^[A-Za-z0-9_-]{86}$",
    ERROR_CODE_PATTERN,
})
"""Patterns of contract fields whose every match `redact_text` leaves unchanged. Why,
rule by rule: none holds ``@``, ``+``, white space, ``(``, ``.`` or two ``:``
(the e-mail, phone, bearer, NANP, IPv4/IPv6 and JWT rules need one of them); the
one ``:`` (``sha256:``, ``ed25519:``) follows letters and digits that spell no
secret key, so the pair rule cannot match; a digit run that the card, SSN or NANP
rules could take must end the text and start after ``:`` or at the start, and every
such run here is longer than those rules' longest match (64 hex, 43 or 86
base64url characters; ``E3`` + three digits starts with a letter). A pattern added
here needs the same argument; tests/unit/test_audit_plan.py runs `redact_text` over
generated matches of each."""

_NO_WORK: Final = None
_TIMESTAMPS: Final = (datetime, AwareDatetime)


def redaction_plan(model: type[BaseModel]) -> Plan:
    """The plan of `model`'s JSON (`to_python(mode="json")`, no aliases)."""
    entries: list[tuple[str, int, Any]] = []
    for name, info in model.model_fields.items():
        if not name.isascii() or (info.alias is not None and info.alias != name):
            raise ValueError(f"{model.__name__}.{name}: plans read fields by their ASCII names")
        kind = (SECRET, None) if is_sensitive_field(name) else _kind(info.annotation,
                                                                      info.metadata)
        if kind is not _NO_WORK:
            entries.append((name, *kind))
    return tuple(entries)


def unannotated(annotation: Any, metadata: list[Any]) -> tuple[Any, list[Any]]:
    """(`annotation` without its `Annotated` layers, `metadata` and theirs): a field's
    type and constraints, however pydantic was given them."""
    while get_origin(annotation) is Annotated:
        annotation, *extras = get_args(annotation)
        metadata = [*metadata, *(m for e in extras
                                 for m in (e.metadata if isinstance(e, FieldInfo) else [e]))]
    return annotation, metadata


def _kind(annotation: Any, metadata: list[Any]) -> tuple[int, Any] | None:
    """(plan kind, nested plan) of a value of type `annotation`; None: nothing to do."""
    annotation, metadata = unannotated(annotation, metadata)
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        members = [a for a in get_args(annotation) if a is not type(None)]
        return _kind(members[0], metadata) if len(members) == 1 else (VALUE, None)
    if annotation is bool or annotation in _TIMESTAMPS:
        return _NO_WORK
    if annotation is int or annotation is float:
        return NUMBER, None
    if annotation is str:
        patterns = {getattr(m, "pattern", None) for m in metadata} - {None}
        return _NO_WORK if patterns & INERT_PATTERNS else (TEXT, None)
    if origin is Literal:
        values = get_args(annotation)
        inert = all(type(v) is str and redact_text(v) == (v, 0) for v in values)
        return _NO_WORK if inert else (VALUE, None)
    if isclass(annotation) and issubclass(annotation, BaseModel):
        plan = redaction_plan(annotation)
        return (OBJECT, plan) if plan else _NO_WORK
    if origin is list:
        (item,) = get_args(annotation)
        if isclass(item) and issubclass(item, BaseModel):
            plan = redaction_plan(item)
            return (OBJECTS, plan) if plan else _NO_WORK
    return VALUE, None


PLANS: Final[dict[type[BaseModel], Plan]] = {
    model: redaction_plan(model) for model in EVENT_MODELS.values()}
"""Each contract model's plan, by model class."""
