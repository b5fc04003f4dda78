"""The registry read model: an in-memory fold of `toolexec.registry`.

Every resolver/executor process keeps its own copy (the topic is read from offset 0
outside any consumer group), so a replica can answer from memory. Versions are
immutable: a second `tool.published` for an existing version with another integrity
is ignored, and the first stays (the log shows both). Each version keeps the executor
pin its event carries, so a rebuild from the log resolves every chain as before. Integrity is NOT checked here:
the log is recorded as it is, and the resolver verifies every link before use.

Anyone who can write to the registry topic can put a `tool.published` on it, so each
publication is held to the operator's `PublicationLimits` before it is kept: file
count and declared sizes first, then every file is inflated in bounded chunks,
measured, hashed and dropped (a file that inflates past its declared size, or to
other bytes than its sha256, refuses the whole publication). Files stay compressed in
memory; the executor inflates one when a run needs it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import structlog

from contracts.envelope import Envelope
from contracts.events import ToolLifecycleChanged, ToolPublished
from domain.errors import RegistryError
from domain.model import ExecutorPin, PublisherSignature, ToolFile, ToolVersion
from domain.publication_limits import (
    DEFAULT_LIMITS,
    PublicationLimits,
    check_inflated,
    inflate,
)
from domain.registry import InMemoryRegistry
from projections.log_position import EndOffsets, LogPosition

log = structlog.get_logger(__name__)


def tool_version_from_event(event: ToolPublished,
                            limits: PublicationLimits = DEFAULT_LIMITS) -> ToolVersion:
    """Translate a `tool.published` contract into the domain's ToolVersion, its files
    kept compressed. Raises RegistryError (E3105) for a publication past `limits` or
    whose files are not what they declare; nothing past the limits is inflated."""
    limits.check_declared((f.path, f.size) for f in event.files)
    files = []
    for f in event.files:
        try:
            packed = base64.b64decode(f.content_b64gz, validate=True)
        except (binascii.Error, ValueError):
            raise RegistryError(f"file {f.path!r} is not base64",
                                details={"path": f.path}) from None
        check_inflated(inflate(packed, limit=f.size, keep=False, path=f.path),
                       sha256=f.sha256, size=f.size, path=f.path)
        files.append(ToolFile(path=f.path, sha256=f.sha256, is_executable=f.is_executable,
                              packed=packed, size=f.size))
    pin = event.executor_pin
    return ToolVersion(tool_id=event.tool_id, version=event.version, manifest=event.manifest,
                       files=tuple(files), integrity=event.integrity,
                       executor_pin=None if pin is None else ExecutorPin(
                           pin.tool_id, pin.version, pin.integrity),
                       publisher_signature=publisher_signature_of(event))


def publisher_signature_of(event: ToolPublished) -> PublisherSignature | None:
    """The publisher signature a `tool.published` carries, as the domain's value."""
    signature = event.publisher_signature
    return None if signature is None else PublisherSignature(signature.key_id,
                                                             signature.signature)


class RegistryLogView:
    """The registry as folded from its topic, for the pipeline (the RegistryReader
    port): fold + positions + bounded catch-up. Not the domain's `RegistryView`
    protocol, which publishers read through the SQL read model
    (`projections.registry_snapshot`)."""

    def __init__(self, end_offsets: EndOffsets | None = None,
                 limits: PublicationLimits = DEFAULT_LIMITS) -> None:
        self._registry = InMemoryRegistry()
        self._limits = limits
        self._refused: dict[tuple[str, str], RegistryError] = {}
        self.position = LogPosition(end_offsets)
        self.revision = 0

    # -- fold -------------------------------------------------------------------
    def apply(self, envelope: Envelope, *, partition: int | None = None,
              offset: int | None = None) -> None:
        """Apply one registry event; record the position it was read at."""
        data = envelope.data
        if isinstance(data, ToolPublished):
            self._apply_published(data)
        elif isinstance(data, ToolLifecycleChanged):
            self._apply_lifecycle(data)
        if partition is not None and offset is not None:
            self.advance(partition, offset)

    def advance(self, partition: int, offset: int) -> None:
        """Mark `offset` of `partition` as read (also for records not applied)."""
        self.position.advance(partition, offset)

    def _apply_published(self, data: ToolPublished) -> None:
        existing = self._registry.get(data.tool_id, data.version)
        if existing is not None:
            if existing.integrity != data.integrity:
                log.warning("registry.conflicting_republish", tool_id=data.tool_id,
                            version=data.version, kept=existing.integrity, ignored=data.integrity)
            return
        try:
            version = tool_version_from_event(data, self._limits)
        except RegistryError as error:
            log.warning("registry.publication_refused", tool_id=data.tool_id,
                        version=data.version, code=error.code, reason=error.message)
            self._refused.setdefault((data.tool_id, data.version), error)
            return
        self._registry.add(version)
        self.revision += 1

    def _apply_lifecycle(self, data: ToolLifecycleChanged) -> None:
        """A lifecycle change names one version, or every version when it names none."""
        targets = ([data.version] if data.version is not None
                   else [tv.version for tv in self._registry.versions(data.tool_id)])
        for version in targets:
            if self._registry.get(data.tool_id, version) is not None:
                self._registry.set_lifecycle(data.tool_id, version, data.lifecycle,
                                             reason=data.reason,
                                             replacement_tool_id=data.replacement_tool_id)
                self.revision += 1

    def refusal(self, tool_id: str, version: str) -> RegistryError | None:
        """Why a `tool.published` of this version on the log was refused (past the
        limits, or files that are not what they declare), if it was: such a version
        is not in the view, so resolving it answers "not found"."""
        return self._refused.get((tool_id, version))

    # -- RegistryReader -----------------------------------------------------------
    def get(self, tool_id: str, version: str) -> ToolVersion | None:
        return self._registry.get(tool_id, version)

    def versions(self, tool_id: str) -> Sequence[ToolVersion]:
        return self._registry.versions(tool_id)

    def tool_ids(self) -> Sequence[str]:
        return list(self._registry.tool_ids())

    def caught_up_with(self, end_offsets: dict[int, int]) -> bool:
        return self.position.caught_up_with(end_offsets)

    async def catch_up(self, timeout: float) -> bool:
        """Wait (bounded) until the view has read the topic up to its end offsets now."""
        return await self.position.catch_up(timeout)

    async def reach(self, end_offset: int, timeout: float) -> bool:
        """Wait (bounded) until the view has read the registry topic (one partition)
        up to `end_offset`."""
        return await self.position.reach({0: end_offset}, timeout)
