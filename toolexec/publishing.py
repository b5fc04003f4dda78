"""Turning tool sources into `tool.published` / `tool.publish.rejected` events.

`plan_publications` is what every publisher runs (`toolexec up`, `toolexec publish`,
`toolexec run --tools`, `POST /v1/tools/register`): validate and seal each source,
then plan the batch against the registry (`domain.publication`): a new version is
published pinned to its executor, a version already published with the same bytes is
left alone (no event), one with other bytes is rejected with E3103, one whose
executor is not in the registry with E3105. Each publication says which right it needs
(`domain.scopes.publish_need`); callers with authorization on check it first.

A publication is checked against the operator's limits before it is compressed
(file count, uncompressed bytes) and once encoded (the whole Kafka record must fit
in `max_record_bytes`), so an oversized tool is a `tool.publish.rejected` (E3105),
never a producer error. A rejection lists at most `MAX_LISTED_ISSUES` issues, so it
fits in a record too.
"""

from __future__ import annotations

import base64
import gzip
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts.envelope import Envelope, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import ExecutorPin as PinContract
from contracts.events import PublishedFile, ToolPublished, ToolPublishRejected
from contracts.events import PublisherSignature as SignatureContract
from contracts.kafka_binding import encode
from domain.errors import PublisherNotTrusted, ToolexecError
from domain.integrity import seal
from domain.model import ExecutorPin, Issue, PublisherSignature, ToolSource, ToolVersion
from domain.publication import plan_publication
from domain.publication_limits import DEFAULT_LIMITS, MIB, PublicationLimits, PublicationTooLarge
from domain.publisher_signature import sign_integrity, signature_valid
from domain.registry import RegistryView
from domain.scopes import Need, publish_need
from domain.validation import executor_name, validate_source

SOURCE = "urn:toolexec:publisher"
DEFAULT_MAX_RECORD_BYTES = MIB
# Record batch and per-record framing around key, value and headers.
RECORD_OVERHEAD_BYTES = 1024
MAX_LISTED_ISSUES = 50

BashSyntax = Callable[[str], str | None]


@dataclass(frozen=True)
class Publication:
    """One offered source and what publishing it does: `published` (event is the
    `tool.published`), `unchanged` (already published with these bytes: no event) or
    `rejected` (event is the `tool.publish.rejected`). `need` is the right it takes."""

    source: ToolSource
    status: Literal["published", "unchanged", "rejected"]
    event: Envelope | None
    need: Need
    tool_id: str | None
    version: str | None
    integrity: str | None = None
    executor_pin: ExecutorPin | None = None
    error: ErrorInfo | None = None


def planned_tool_ids(sources: Iterable[ToolSource]) -> set[str]:
    """The tool ids whose registry versions `plan_publications` reads for `sources`:
    their own ids and their executors'."""
    ids: set[str] = set()
    for source in sources:
        for value in (source.manifest.get("tool_id"),
                      executor_name(source.manifest.get("executor"))):
            if isinstance(value, str) and value:
                ids.add(value)
    return ids


def plan_publications(sources: Sequence[ToolSource], registry: RegistryView, *,
                      now: datetime, published_by: str | None = None,
                      bash_syntax: BashSyntax | None = None,
                      known_tools: dict[str, str] | None = None,
                      limits: PublicationLimits = DEFAULT_LIMITS,
                      max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> list[Publication]:
    """What publishing `sources` together does, one Publication per source in order.
    `registry` must hold every version of `planned_tool_ids(sources)`."""
    checked: list[ToolVersion | Envelope] = [
        _checked(source, now, bash_syntax, known_tools, limits) for source in sources]
    sealed = [item for item in checked if isinstance(item, ToolVersion)]
    plans = iter(plan_publication(sealed, registry))
    publications = []
    for source, item in zip(sources, checked, strict=True):
        if isinstance(item, Envelope):
            publications.append(_rejection(source, item, registry))
            continue
        plan = next(plans)
        need = publish_need(item.tool_id, item.tool_type, _types(registry, item.tool_id))
        if plan.outcome == "new":
            event = publish_event(source, now=now, published_by=published_by,
                                  sealed=plan.version, executor_pin=plan.version.executor_pin,
                                  max_record_bytes=max_record_bytes)
            publications.append(_from_event(source, event, need)
                                if event.type == "tool.published"
                                else _rejection(source, event, registry))
        elif plan.outcome == "unchanged":
            publications.append(Publication(
                source, "unchanged", None, need, item.tool_id, item.version,
                integrity=plan.version.integrity, executor_pin=plan.version.executor_pin))
        else:
            assert plan.error is not None
            issue = Issue(path="$.executor" if plan.outcome == "unresolvable" else "$.version",
                          message=plan.error.message)
            event = _rejected(item.tool_id, item.version, source.origin, [issue], now,
                              plan.error.message, code=plan.error.code,
                              details=plan.error.details)
            publications.append(_rejection(source, event, registry))
    return publications


def _types(registry: RegistryView, tool_id: str) -> set[str]:
    return {tv.tool_type for tv in registry.versions(tool_id)}


def _from_event(source: ToolSource, event: Envelope, need: Need) -> Publication:
    data = event.data
    assert isinstance(data, ToolPublished)
    pin = data.executor_pin
    return Publication(source, "published", event, need, data.tool_id, data.version,
                       integrity=data.integrity,
                       executor_pin=None if pin is None else ExecutorPin(
                           pin.tool_id, pin.version, pin.integrity))


def _rejection(source: ToolSource, event: Envelope, registry: RegistryView) -> Publication:
    data = event.data
    assert isinstance(data, ToolPublishRejected)
    tool_type = source.manifest.get("tool_type")
    need = publish_need(data.tool_id, tool_type if isinstance(tool_type, str) else None,
                        _types(registry, data.tool_id) if data.tool_id else ())
    return Publication(source, "rejected", event, need, data.tool_id, data.version,
                       error=data.error)


def _checked(source: ToolSource, now: datetime, bash_syntax: BashSyntax | None,
             known_tools: dict[str, str] | None,
             limits: PublicationLimits = DEFAULT_LIMITS) -> ToolVersion | Envelope:
    """The sealed version, or the rejection of a source past `limits` or failing
    validation (E3105)."""
    tool_id = _str_or_none(source.manifest.get("tool_id"))
    version = _str_or_none(source.manifest.get("version"))
    try:
        limits.check_declared((f.path, len(f.content or b"")) for f in source.files)
    except PublicationTooLarge as error:
        return _rejected(tool_id, version, source.origin,
                         [Issue(path="$.files", message=error.message)], now,
                         "tool is too large to publish", details=error.details)
    issues = [i for i in validate_source(source, bash_syntax=bash_syntax, known_tools=known_tools)
              if i.severity == "error"]
    if issues:
        return _rejected(tool_id, version, source.origin, issues, now,
                         "tool source failed validation")
    try:
        sealed = seal(source)
    except ToolexecError as error:
        return _rejected(tool_id, version, source.origin,
                         [Issue(path="$", message=error.message)], now, error.message)
    return sealed


def publish_event(source: ToolSource, *, now: datetime, published_by: str | None = None,
                  bash_syntax: BashSyntax | None = None,
                  known_tools: dict[str, str] | None = None,
                  sealed: ToolVersion | None = None,
                  executor_pin: ExecutorPin | None = None,
                  limits: PublicationLimits = DEFAULT_LIMITS,
                  max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Envelope:
    """Validate (layers 1-2) and seal one tool source into the event that records it:
    `tool.published` (pinned to `executor_pin` when given), or
    `tool.publish.rejected` listing every issue (E3105) — also when the tool is past
    `limits` or its record would be larger than `max_record_bytes`. Publishers plan a
    batch with `plan_publications`, which pins every version; this is its
    single-source step."""
    checked = (sealed if sealed is not None
               else _checked(source, now, bash_syntax, known_tools, limits))
    if isinstance(checked, Envelope):
        return checked
    files = [PublishedFile(path=f.path, sha256=f.sha256, is_executable=f.is_executable,
                           size=len(f.content or b""), content_b64gz=_packed(f.content))
             for f in checked.files]
    data = ToolPublished(
        tool_id=checked.tool_id, version=checked.version, tool_type=checked.tool_type,
        executor=checked.executor, manifest=dict(checked.manifest), files=files,
        integrity=checked.integrity, published_by=published_by, source=source.origin or None,
        executor_pin=None if executor_pin is None else PinContract(
            tool_id=executor_pin.tool_id, version=executor_pin.version,
            integrity=executor_pin.integrity),
    )
    event = _envelope(data, checked.tool_id, now,
                      f"{checked.tool_id}@{checked.version}:{checked.integrity}")
    size = record_size(event)
    if size > max_record_bytes:
        return _rejected(checked.tool_id, checked.version, source.origin,
                         [Issue(path="$", message=f"the publication record would be {size} "
                                f"bytes, more than the {max_record_bytes}-byte limit of one "
                                "record (files are sent gzip-compressed)")],
                         now, "tool is too large to publish",
                         details={"limit": "record_bytes", "max": max_record_bytes,
                                  "actual": size})
    return event


def signed(publication: Publication, signature: PublisherSignature) -> Publication:
    """`publication` with its `tool.published` carrying the publisher `signature`;
    PublisherNotTrusted (E3107) when the signature is not valid over its integrity
    (made for other contents, or not a signature). Other publications are returned
    as they are: only a new version records a signature."""
    event = publication.event
    if event is None or not isinstance(event.data, ToolPublished):
        return publication
    if not signature_valid(signature, event.data.integrity):
        raise PublisherNotTrusted(
            f"the publisher signature given for {publication.tool_id}@{publication.version} "
            f"is not a valid signature of its integrity {event.data.integrity}",
            details={"tool_id": publication.tool_id, "version": publication.version,
                     "integrity": event.data.integrity, "key_id": signature.key_id})
    data = event.data.model_copy(update={"publisher_signature": SignatureContract(
        key_id=signature.key_id, signature=signature.signature)})
    return replace(publication, event=replace(event, data=data))


def sign_publications(publications: Sequence[Publication],
                      private_key: Ed25519PrivateKey) -> list[Publication]:
    """Every new version of `publications` signed with the publisher's `private_key`."""
    return [signed(p, sign_integrity(private_key, p.integrity)) if p.status == "published"
            and p.integrity else p for p in publications]


def record_size(event: Envelope) -> int:
    """Bytes the event takes as one Kafka record (key, value, headers, framing)."""
    record = encode(event)
    return (len(record.key) + len(record.value) + RECORD_OVERHEAD_BYTES
            + sum(len(name) + len(value) for name, value in record.headers))


def rejected_source(origin: str, error: ToolexecError, now: datetime) -> Envelope:
    """The `tool.publish.rejected` of a source that could not even be read (an
    unreadable or oversized directory, a symlinked manifest, a YAML bomb)."""
    return _rejected(None, None, origin, [Issue(path="$", message=error.message)], now,
                     error.message)


def unreadable(origin: str, error: ToolexecError, now: datetime) -> Publication:
    """The rejection of a source that could not even be read (E3105)."""
    event = rejected_source(origin, error, now)
    return Publication(ToolSource({}, (), origin), "rejected", event,
                       publish_need(None, None), None, None, error=event.data.error)


def _packed(content: bytes | None) -> str:
    return base64.b64encode(gzip.compress(content or b"", mtime=0)).decode("ascii")


def _rejected(tool_id: str | None, version: str | None, origin: str, issues: list[Issue],
              now: datetime, message: str, *, code: str = "E3105",
              details: dict[str, object] | None = None) -> Envelope:
    listed = [issue.to_dict() for issue in issues[:MAX_LISTED_ISSUES]]
    if len(issues) > MAX_LISTED_ISSUES:
        listed.append(Issue(path="$", message=f"... and {len(issues) - MAX_LISTED_ISSUES} "
                            "more issue(s) not listed").to_dict())
    data = ToolPublishRejected(
        tool_id=tool_id, version=version, origin=origin, issues=listed,
        error=ErrorInfo(code=code, message=message,
                        details={**(details or {}), "issues": listed}),
    )
    key = tool_id or origin or "unknown"
    return _envelope(data, key, now, f"rejected:{key}:{version}:{now.isoformat()}")


def _envelope(data: ToolPublished | ToolPublishRejected, key: str, now: datetime,
              identity: str) -> Envelope:
    event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"urn:toolexec:publish:{identity}"))
    return new_envelope(data, source=SOURCE, partitionkey=key, correlationid=event_id,
                        id=event_id, time=now)


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)
