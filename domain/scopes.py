"""What a capability token allows besides invoking tools: the `scopes` claim.

```json
"scopes": {"publish": ["acme_*"], "lifecycle": ["acme_*"], "approve": ["acme_*"],
           "policy": true, "audit": true, "admin": true}
```
Every key is optional; a token without `scopes` (only the `tools` claim) may only
invoke. Namespaced scopes list tool-id patterns: an exact tool id (`hello`), a prefix
ending in `*` (`acme_*`: every tool id starting with `acme_`), or `*` (every tool).

- `publish`: publish new versions of matching tools (script, api, mcp_tool, knowledge,
  directive types);
- `lifecycle`: deprecate, sunset, remove or restore versions of matching tools;
- `approve`: approve drifted MCP tool definitions of matching servers (the right is
  on the server's tool id); decide approval requests for invocations of matching tools;
- `policy`: apply ABAC policy sets;
- `audit`: read the audit trail and every caller's invocations (without it a caller
  reads only its own invocations);
- `admin`: every scope above on every tool, and the only right that publishes or
  changes the lifecycle of runtimes, primitives and MCP servers (the code every other
  tool runs on). Admin does not grant invoking: that stays in `tools`.

Pure: no I/O. `Need` says what an action requires; `missing` says why a grant falls
short (None when it does not).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

NAMESPACED_SCOPES: tuple[str, ...] = ("publish", "lifecycle", "approve")
FLAG_SCOPES: tuple[str, ...] = ("policy", "audit", "admin")
ADMIN_TOOL_TYPES: frozenset[str] = frozenset({"runtime", "primitive", "mcp_server"})
"""Tool types other tools run on: publishing or retiring them needs admin."""

_NAMESPACE = re.compile(r"^(\*|[a-z][a-z0-9_]*\*?)$")

Scope = Literal["publish", "lifecycle", "approve", "policy", "audit"]


class ScopeClaimError(ValueError):
    """The `scopes` claim is not in the documented format."""


@dataclass(frozen=True, slots=True)
class Scopes:
    """The rights of a token besides invoking, as granted by its `scopes` claim."""

    publish: tuple[str, ...] = ()
    lifecycle: tuple[str, ...] = ()
    approve: tuple[str, ...] = ()
    policy: bool = False
    audit: bool = False
    admin: bool = False

    def to_claim(self) -> dict[str, Any]:
        """The `scopes` claim granting exactly these rights (empty ones left out)."""
        claim: dict[str, Any] = {name: list(getattr(self, name)) for name in NAMESPACED_SCOPES
                                 if getattr(self, name)}
        claim.update({name: True for name in FLAG_SCOPES if getattr(self, name)})
        return claim

    @property
    def empty(self) -> bool:
        return not self.to_claim()


NO_SCOPES = Scopes()


def parse_scopes(claim: Any) -> Scopes:
    """The Scopes of a token's `scopes` claim (None = no scopes).

    Raises ScopeClaimError naming the first problem: unknown scope, a namespaced scope
    that is not a list of patterns, a flag that is not a boolean."""
    if claim is None:
        return NO_SCOPES
    if not isinstance(claim, Mapping):
        raise ScopeClaimError("scopes must be an object")
    unknown = sorted(set(claim) - set(NAMESPACED_SCOPES) - set(FLAG_SCOPES))
    if unknown:
        raise ScopeClaimError(f"unknown scope {unknown[0]!r}; known: "
                              f"{', '.join(NAMESPACED_SCOPES + FLAG_SCOPES)}")
    values: dict[str, Any] = {}
    for name in NAMESPACED_SCOPES:
        values[name] = tuple(_patterns(name, claim.get(name, [])))
    for name in FLAG_SCOPES:
        flag = claim.get(name, False)
        if not isinstance(flag, bool):
            raise ScopeClaimError(f"scopes.{name} must be true or false")
        values[name] = flag
    return Scopes(**values)


def _patterns(name: str, value: Any) -> Iterable[str]:
    if not isinstance(value, list):
        raise ScopeClaimError(f"scopes.{name} must be a list of tool-id patterns")
    for pattern in value:
        if not is_namespace(pattern):
            raise ScopeClaimError(f"scopes.{name}: {pattern!r} is not a tool id, a prefix "
                                  "ending in '*' or '*'")
    return value


def is_namespace(pattern: Any) -> bool:
    """Whether `pattern` is a valid tool-id pattern (`hello`, `acme_*`, `*`)."""
    return isinstance(pattern, str) and bool(_NAMESPACE.match(pattern))


def namespace_covers(pattern: str, tool_id: str) -> bool:
    """Whether the tool-id pattern `pattern` covers `tool_id`."""
    if pattern.endswith("*"):
        return tool_id.startswith(pattern[:-1])
    return tool_id == pattern


@dataclass(frozen=True, slots=True)
class Need:
    """What one action requires of a token: a scope, for one tool id when the scope is
    namespaced, and whether only admin will do."""

    scope: Scope
    tool_id: str | None = None
    admin: bool = False

    def describe(self) -> str:
        what = "admin" if self.admin else self.scope
        return f"{what} on {self.tool_id}" if self.tool_id else what


def publish_need(tool_id: str | None, tool_type: str | None,
                 existing_types: Iterable[str] = ()) -> Need:
    """Publishing a version of `tool_id`: admin when it (or any version already in the
    registry) is a runtime, primitive or MCP server, else publish on its namespace
    (None: a source without a tool id, which any publish grant may submit)."""
    admin = bool(ADMIN_TOOL_TYPES & {tool_type or "", *existing_types})
    return Need("publish", tool_id, admin=admin)


def lifecycle_need(tool_id: str, tool_types: Iterable[str] = ()) -> Need:
    """Changing the lifecycle of `tool_id` (whose versions have `tool_types`): admin for
    runtimes, primitives and MCP servers, else lifecycle on its namespace."""
    return Need("lifecycle", tool_id, admin=bool(ADMIN_TOOL_TYPES & set(tool_types)))


def approve_need(tool_id: str) -> Need:
    """Deciding an approval request for an invocation of `tool_id`, or approving a
    drifted definition announced by the MCP server `tool_id`."""
    return Need("approve", tool_id)


POLICY_NEED = Need("policy")
AUDIT_NEED = Need("audit")


def missing(scopes: Scopes, need: Need) -> str | None:
    """Why `scopes` do not grant `need`, or None when they do."""
    if scopes.admin:
        return None
    if need.admin:
        return f"only an admin token may do this to {need.tool_id}" if need.tool_id else \
            "only an admin token may do this"
    granted = getattr(scopes, need.scope)
    if need.scope in NAMESPACED_SCOPES:
        if need.tool_id is None:  # e.g. a source without a tool id: any grant will do
            return None if granted else f"the token has no {need.scope} scope"
        if any(namespace_covers(p, need.tool_id) for p in granted):
            return None
        return f"the token has no {need.scope} scope covering {need.tool_id}"
    return None if granted else f"the token has no {need.scope} scope"
