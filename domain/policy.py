"""ABAC on top of the capability token: who may invoke which tool version, as data.

The request (principal = the token's subject, action = `tool.invoke`, resource = the
leaf tool version with its manifest attributes, context = parameter keys and time) is
evaluated by a `PolicyEvaluator` port against the current `PolicyBundle` (every
policy set folded from `policy.updated` events). The Cedar adapter lives in
`consumers.adapters.policy_engine`; this module holds the request model, the default when no
policy is loaded and the decision cache, and does no I/O.

Defaults: with no policy set loaded, a request carrying a valid token is allowed
(`default_decision="allow"`); once any policy set is loaded, Cedar semantics apply:
denied unless some `permit` matches and no `forbid` does.

Decision cache: keyed by (subject, tool_id, version, policy version, parameter keys),
entries live `ttl_seconds` (300 by default). A new policy version makes old keys
unreachable, and the view that folds `policy.updated` also clears the cache. Policies
that look at `context.now` are cached too: their answer may be up to one TTL stale.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from domain.bounded import remember

ACTION = "tool.invoke"
DefaultDecision = Literal["allow", "deny"]


@dataclass(frozen=True, slots=True)
class ToolResource:
    """The resource of a request: one tool version and the attributes policies see."""

    tool_id: str
    version: str
    required_permissions: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    provider: str = ""
    tool_type: str = ""

    @classmethod
    def from_manifest(cls, tool_id: str, version: str,
                      manifest: Mapping[str, Any]) -> ToolResource:
        """Attributes taken from a (normalised) manifest; absent ones are empty."""
        return cls(
            tool_id=tool_id, version=version,
            required_permissions=_strings(manifest.get("required_permissions")),
            tags=_strings(manifest.get("tags")),
            provider=str(manifest.get("provider") or ""),
            tool_type=str(manifest.get("tool_type") or ""),
        )

    @property
    def uid(self) -> str:
        return f"{self.tool_id}@{self.version}"


@dataclass(frozen=True, slots=True)
class AccessRequest:
    """One ABAC question: may `subject` invoke `resource` now with these parameter keys?"""

    subject: str
    resource: ToolResource
    parameter_keys: tuple[str, ...] = ()
    now: int = 0

    @classmethod
    def build(cls, subject: str, resource: ToolResource, parameters: Mapping[str, Any], *,
              now: int) -> AccessRequest:
        """Only the parameter *keys* are kept: values may be secrets or personal data."""
        return cls(subject, resource, tuple(sorted(str(k) for k in parameters)), now)


@dataclass(frozen=True, slots=True)
class PolicyBundle:
    """Every policy set currently in force, as one unit with one version.

    `sets` maps policy_set_id -> (version, Cedar policy text). `version` names the
    combination, so it changes whenever any set changes.
    """

    sets: Mapping[str, tuple[str, str]]

    @property
    def version(self) -> str:
        return ",".join(f"{sid}:{ver}" for sid, (ver, _) in sorted(self.sets.items()))

    @property
    def text(self) -> str:
        return "\n".join(text for _, (_, text) in sorted(self.sets.items()))


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """An ABAC outcome. `policy_ids` names the policies that decided (with their
    `@id`/`@reason` annotations folded into `reason` by the evaluator)."""

    allowed: bool
    reason: str
    policy_version: str | None = None
    policy_ids: tuple[str, ...] = ()
    cached: bool = False
    approval: tuple[str, ...] = ()
    """On allow: the matching permits that require approval (`@approval("required")`),
    each described as in `reason`; empty when none does."""


class PolicyEvaluator(Protocol):
    """Evaluates one request against a bundle (e.g. Cedar, in-process)."""

    def evaluate(self, bundle: PolicyBundle, request: AccessRequest) -> PolicyDecision: ...


CacheKey = tuple[str, str, str, str, tuple[str, ...]]

EXTERNAL_VERSION = "external"
"""The policy version of decisions made by an external ABAC engine (its policies are
not in the log; cached decisions of it expire by TTL only)."""


def cache_key(request: AccessRequest, policy_version: str) -> CacheKey:
    """(subject, tool, version, policy version, parameter keys)."""
    r = request.resource
    return (request.subject, r.tool_id, r.version, policy_version, request.parameter_keys)


@dataclass
class DecisionCache:
    """In-process decision cache with a TTL, bounded, with hit/miss counters.

    Time comes in as an argument (`now`, seconds, any monotonic origin)."""

    ttl_seconds: float = 300.0
    limit: int = 100_000
    hits: int = 0
    misses: int = 0
    invalidations: int = 0
    _entries: OrderedDict[CacheKey, tuple[float, PolicyDecision]] = field(
        default_factory=OrderedDict)

    def get(self, key: CacheKey, *, now: float) -> PolicyDecision | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] <= now:
            if entry is not None:
                del self._entries[key]
            self.misses += 1
            return None
        self.hits += 1
        return entry[1]

    def put(self, key: CacheKey, decision: PolicyDecision, *, now: float) -> None:
        remember(self._entries, key, (now + self.ttl_seconds, decision), self.limit)

    def clear(self) -> None:
        """Drop every entry (a policy.updated was folded)."""
        self._entries.clear()
        self.invalidations += 1

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def counters(self) -> dict[str, float]:
        """For metrics: hits, misses, invalidations, size, hit_rate."""
        return {"hits": self.hits, "misses": self.misses, "invalidations": self.invalidations,
                "size": len(self._entries), "hit_rate": self.hit_rate}


def decide(request: AccessRequest, bundle: PolicyBundle | None, evaluator: PolicyEvaluator,
           cache: DecisionCache | None, *, clock: float,
           default: DefaultDecision = "allow") -> PolicyDecision:
    """The ABAC decision for `request`: the default when no policy is loaded, else the
    evaluator's answer, served from `cache` when it holds a live entry."""
    if bundle is None or not bundle.sets:
        reason = f"no policy loaded: default {default}"
        return PolicyDecision(allowed=default == "allow", reason=reason)
    key = cache_key(request, bundle.version)
    if cache is not None:
        hit = cache.get(key, now=clock)
        if hit is not None:
            return PolicyDecision(hit.allowed, hit.reason, hit.policy_version, hit.policy_ids,
                                  cached=True, approval=hit.approval)
    decision = evaluator.evaluate(bundle, request)
    if cache is not None:
        cache.put(key, decision, now=clock)
    return decision


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence):
        return tuple(str(v) for v in value)
    return ()
