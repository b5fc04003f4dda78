"""Turning tool sources into `tool.published` / `tool.publish.rejected` events.

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
from collections.abc import Callable
from datetime import datetime

from contracts.envelope import Envelope, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import PublishedFile, ToolPublished, ToolPublishRejected
from contracts.kafka_binding import encode
from domain.errors import ToolexecError
from domain.integrity import seal
from domain.model import Issue, ToolSource
from domain.publication_limits import DEFAULT_LIMITS, MIB, PublicationLimits, PublicationTooLarge
from domain.validation import validate_source

SOURCE = "urn:toolexec:publisher"
DEFAULT_MAX_RECORD_BYTES = MIB
# Record batch and per-record framing around key, value and headers.
RECORD_OVERHEAD_BYTES = 1024
MAX_LISTED_ISSUES = 50


def publish_event(source: ToolSource, *, now: datetime, published_by: str | None = None,
                  bash_syntax: Callable[[str], str | None] | None = None,
                  known_tools: dict[str, str] | None = None,
                  limits: PublicationLimits = DEFAULT_LIMITS,
                  max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Envelope:
    """Validate (layers 1-2) and seal a tool source into the event that records it:
    `tool.published`, or `tool.publish.rejected` listing every issue (E3105) — also
    when the tool is past `limits` or its record would be larger than
    `max_record_bytes`."""
    tool_id = _str_or_none(source.manifest.get("tool_id"))
    version = _str_or_none(source.manifest.get("version"))
    try:
        limits.check_declared((f.path, len(f.content or b"")) for f in source.files)
    except PublicationTooLarge as error:
        return _rejected(tool_id, version, source.origin,
                         [Issue(path="$.files", message=error.message)], now,
                         "tool is too large to publish", error.details)
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
    files = [
        PublishedFile(path=f.path, sha256=f.sha256, is_executable=f.is_executable,
                      size=len(f.content or b""),
                      content_b64gz=base64.b64encode(gzip.compress(f.content or b"", mtime=0))
                      .decode("ascii"))
        for f in sealed.files
    ]
    data = ToolPublished(
        tool_id=sealed.tool_id, version=sealed.version, tool_type=sealed.tool_type,
        executor=sealed.executor, manifest=dict(sealed.manifest), files=files,
        integrity=sealed.integrity, published_by=published_by, source=source.origin or None,
    )
    event = _envelope(data, sealed.tool_id, now,
                      f"{sealed.tool_id}@{sealed.version}:{sealed.integrity}")
    size = record_size(event)
    if size > max_record_bytes:
        return _rejected(sealed.tool_id, sealed.version, source.origin,
                         [Issue(path="$", message=f"the publication record would be {size} "
                                f"bytes, more than the {max_record_bytes}-byte limit of one "
                                "record (files are sent gzip-compressed)")],
                         now, "tool is too large to publish",
                         {"limit": "record_bytes", "max": max_record_bytes, "actual": size})
    return event


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


def _rejected(tool_id: str | None, version: str | None, origin: str, issues: list[Issue],
              now: datetime, message: str, details: dict[str, object] | None = None,
              ) -> Envelope:
    listed = [issue.to_dict() for issue in issues[:MAX_LISTED_ISSUES]]
    if len(issues) > MAX_LISTED_ISSUES:
        listed.append(Issue(path="$", message=f"... and {len(issues) - MAX_LISTED_ISSUES} "
                            "more issue(s) not listed").to_dict())
    data = ToolPublishRejected(
        tool_id=tool_id, version=version, origin=origin, issues=listed,
        error=ErrorInfo(code="E3105", message=message,
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
