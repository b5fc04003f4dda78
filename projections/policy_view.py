"""The policy read model: an in-memory fold of `policy.updated` from `toolexec.policies`.

Each authorize process keeps its own copy (the topic is read from offset 0 outside any
consumer group). The latest `policy.updated` of a policy set replaces that set; the
current `PolicyBundle` combines every set and has one version. Listeners registered
with `on_change` (the decision cache's `clear`) run on every change, so cached
decisions never outlive the policies they were made under, with no side channel.

Policy text that does not parse is not applied (the previous version stays in force)
when a `validate` function is given; the log keeps the bad version for the record.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from contracts.envelope import Envelope
from contracts.events import PolicyUpdated
from domain.policy import PolicyBundle
from projections.log_position import EndOffsets, LogPosition

log = structlog.get_logger(__name__)

Validate = Callable[[str], object]
ToText = Callable[[list[dict]], str]


class PolicyView:
    """Implements the authorize step's `PolicySource` port."""

    def __init__(self, *, validate: Validate | None = None, to_text: ToText | None = None,
                 end_offsets: EndOffsets | None = None) -> None:
        self.position = LogPosition(end_offsets)
        self._ready = False
        self._sets: dict[str, tuple[str, str]] = {}
        self._bundle: PolicyBundle | None = None
        self._validate = validate
        self._to_text = to_text
        self._listeners: list[Callable[[], None]] = []
        self.revision = 0

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every applied policy change."""
        self._listeners.append(listener)

    def advance(self, partition: int, offset: int) -> None:
        """Mark `offset` of `partition` as read (also for records not applied)."""
        self.position.advance(partition, offset)

    async def ready(self, timeout: float) -> bool:
        """True once the view has read every policy recorded before its first call:
        no decision is made on a view still loading (after a restart, a deny policy
        would otherwise be missed). Later updates apply as they arrive."""
        if not self._ready:
            self._ready = await self.position.catch_up(timeout)
        return self._ready

    def current(self) -> PolicyBundle | None:
        """Every policy set in force, or None when none was ever applied."""
        return self._bundle

    def apply(self, envelope: Envelope) -> bool:
        """Fold one event; True when the policy bundle changed."""
        data = envelope.data
        if not isinstance(data, PolicyUpdated):
            return False
        if data.engine != "cedar":
            log.warning("policy.engine_not_supported", policy_set_id=data.policy_set_id,
                        engine=data.engine)
            return False
        text = self._text_of(data)
        if text is None:
            return False
        if self._sets.get(data.policy_set_id) == (data.version, text):
            return False
        self._sets[data.policy_set_id] = (data.version, text)
        self._bundle = PolicyBundle(dict(self._sets))
        self.revision += 1
        for listener in self._listeners:
            listener()
        log.info("policy.applied", policy_set_id=data.policy_set_id, version=data.version)
        return True

    def _text_of(self, data: PolicyUpdated) -> str | None:
        try:
            if isinstance(data.policies, str):
                text = data.policies
            elif self._to_text is not None:
                text = self._to_text(list(data.policies))
            else:
                raise ValueError("policy documents in JSON form need a converter")
            if self._validate is not None:
                self._validate(text)
        except Exception as error:  # boundary: a bad policy version is skipped, not fatal
            log.warning("policy.rejected", policy_set_id=data.policy_set_id,
                        version=data.version, error=str(error))
            return None
        return text
