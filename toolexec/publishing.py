"""Turning tool sources into `tool.published` / `tool.publish.rejected` events."""

from __future__ import annotations

import base64
import gzip
import uuid
from collections.abc import Callable
from datetime import datetime

from contracts.envelope import Envelope, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import PublishedFile, ToolPublished, ToolPublishRejected
from domain.errors import ToolexecError
from domain.integrity import seal
from domain.model import Issue, ToolSource
from domain.validation import validate_source

SOURCE = "urn:toolexec:publisher"
# Leaves room for CloudEvent headers and the manifest under the broker's 1 MiB default.
MAX_PUBLISHED_BYTES = 900 * 1024


def publish_event(source: ToolSource, *, now: datetime, published_by: str | None = None,
                  bash_syntax: Callable[[str], str | None] | None = None,
                  known_tools: dict[str, str] | None = None) -> Envelope:
    """Validate (layers 1-2) and seal a tool source into the event that records it:
    `tool.published`, or `tool.publish.rejected` listing every issue (E3105)."""
    issues = [i for i in validate_source(source, bash_syntax=bash_syntax, known_tools=known_tools)
              if i.severity == "error"]
    tool_id = _str_or_none(source.manifest.get("tool_id"))
    version = _str_or_none(source.manifest.get("version"))
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
    size = sum(len(f.content_b64gz) for f in files)
    if size > MAX_PUBLISHED_BYTES:
        return _rejected(sealed.tool_id, sealed.version, source.origin,
                         [Issue(path="$.files", message=f"{size} bytes compressed exceeds "
                                f"the {MAX_PUBLISHED_BYTES}-byte limit of one event")],
                         now, "tool is too large to publish")
    data = ToolPublished(
        tool_id=sealed.tool_id, version=sealed.version, tool_type=sealed.tool_type,
        executor=sealed.executor, manifest=dict(sealed.manifest), files=files,
        integrity=sealed.integrity, published_by=published_by, source=source.origin or None,
    )
    return _envelope(data, sealed.tool_id, now, f"{sealed.tool_id}@{sealed.version}:{sealed.integrity}")


def _rejected(tool_id: str | None, version: str | None, origin: str, issues: list[Issue],
              now: datetime, message: str) -> Envelope:
    data = ToolPublishRejected(
        tool_id=tool_id, version=version, origin=origin,
        issues=[issue.to_dict() for issue in issues],
        error=ErrorInfo(code="E3105", message=message,
                        details={"issues": [issue.to_dict() for issue in issues]}),
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
