"""Policy what-if: which recorded decisions a candidate policy bundle would change.

Every `tool.permission.decided` records the inputs of its ABAC question: the subject
(on a policy deny, also in the error's details for records written before the field
was filled there), the tool version (whose manifest the registry keeps: versions never
change), the parameter keys and the moment of the decision. Replaying them against a
candidate bundle tells, per invocation, whether the outcome would flip.

Only decisions a policy could change are replayed: with authorization enforced, the
token accepted (an allow, or a deny by policy, E3206). A deny of the token itself
(expired, bad signature, tool not granted) stands whatever the policies say.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from domain.policy import (
    AccessRequest,
    DefaultDecision,
    PolicyBundle,
    PolicyEvaluator,
    ToolResource,
    decide,
)

POLICY_DENY_CODE = "E3206"
Outcome = Literal["allow", "deny"]


@dataclass(frozen=True, slots=True)
class RecordedDecision:
    """The inputs and outcome of one recorded permission decision."""

    invocation_id: str
    tool_id: str
    version: str
    subject: str | None
    parameter_keys: tuple[str, ...]
    now: int
    decision: Outcome
    enforced: bool
    code: str | None = None

    @property
    def replayable(self) -> bool:
        """Whether a policy could have changed this decision (see module docstring)."""
        return (self.enforced and self.subject is not None
                and (self.decision == "allow" or self.code == POLICY_DENY_CODE))


@dataclass(frozen=True, slots=True)
class Change:
    """One invocation whose outcome the candidate flips."""

    invocation_id: str
    tool_id: str
    version: str
    subject: str
    before: Outcome
    after: Outcome
    reason: str
    """The candidate's reason (its deciding policies)."""

    @property
    def kind(self) -> str:
        return f"{self.before}->{self.after}"


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The replay's outcome: the changes, how many decisions were replayed and how many
    were left out (not replayable, or their tool version unknown)."""

    changes: tuple[Change, ...]
    replayed: int
    skipped: int

    def by_tool_and_agent(self) -> dict[tuple[str, str], Counter[str]]:
        """Per (tool_id, subject): how many `allow->deny` and `deny->allow`."""
        summary: dict[tuple[str, str], Counter[str]] = {}
        for change in self.changes:
            summary.setdefault((change.tool_id, change.subject), Counter())[change.kind] += 1
        return summary


Resources = Callable[[str, str], ToolResource | None]


def what_if(decisions: Iterable[RecordedDecision], resources: Resources,
            candidate: PolicyBundle | None, evaluator: PolicyEvaluator, *,
            default: DefaultDecision = "allow") -> WhatIf:
    """Replay `decisions` against `candidate` (`default` when it holds no set);
    `resources(tool_id, version)` gives a version's policy attributes (None: unknown)."""
    changes: list[Change] = []
    replayed = skipped = 0
    for recorded in decisions:
        resource = resources(recorded.tool_id, recorded.version) if recorded.replayable \
            else None
        if resource is None or recorded.subject is None:
            skipped += 1
            continue
        replayed += 1
        request = AccessRequest(recorded.subject, resource, recorded.parameter_keys,
                                recorded.now)
        decision = decide(request, candidate, evaluator, None, clock=recorded.now,
                          default=default)
        after: Outcome = "allow" if decision.allowed else "deny"
        if after != recorded.decision:
            changes.append(Change(recorded.invocation_id, recorded.tool_id, recorded.version,
                                  recorded.subject, recorded.decision, after, decision.reason))
    return WhatIf(tuple(changes), replayed, skipped)


def with_set(bundle: PolicyBundle | None, set_id: str, version: str,
             text: str) -> PolicyBundle:
    """`bundle` with the policy set `set_id` replaced by (`version`, `text`), as
    applying it would leave the sets in force."""
    sets = dict(bundle.sets) if bundle is not None else {}
    sets[set_id] = (version, text)
    return PolicyBundle(sets)
