"""Which credentials a tool may receive: those the operator granted it and it declares.

A plan refers to a credential as `${NAME}` in a subprocess environment value or an
HTTP header. The reference is honoured only when
1. a manifest of the chain lists `credentials:NAME` in `required_permissions` (the
   author says what the tool needs: undeclared -> E3206), and
2. the operator granted NAME to the tool (`CredentialGrants`, from
   TOOLEXEC_CREDENTIAL_GRANTS: `{"DB_PASSWORD": ["tool_a", "ns.*"]}`): a declaration
   alone grants nothing, so a published tool cannot ask its way to a secret the
   executor holds (a cloud key in its environment, say). Not granted -> E3206.
The tool a grant must name is the invoked tool (the chain's leaf) — for an MCP tool,
its MCP server, the process or connection that holds the credential.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.errors import AuthorizationError, ToolexecError
from domain.model import HttpPlan, McpPlan, ResolvedChain, SubprocessPlan

PREFIX = "credentials:"
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

Secrets = Callable[[str], str | None]


def declared_credentials(chain: ResolvedChain) -> frozenset[str]:
    """Names of every `credentials:NAME` permission declared along the chain."""
    names = set()
    for link in chain.links:
        for permission in link.manifest.get("required_permissions") or ():
            if isinstance(permission, str) and permission.startswith(PREFIX):
                names.add(permission[len(PREFIX):])
    return frozenset(names)


def references(plan: SubprocessPlan | HttpPlan | McpPlan) -> list[str]:
    """Credential names the plan refers to, in order of appearance, without repeats."""
    if isinstance(plan, McpPlan):
        inner = plan.server or plan.endpoint
        return [] if inner is None else references(inner)
    values: Iterable[str] = (plan.env.values() if isinstance(plan, SubprocessPlan)
                             else plan.headers.values())
    return list(dict.fromkeys(m.group(1) for v in values for m in REFERENCE.finditer(str(v))))


def scoped_secrets(plan: SubprocessPlan | HttpPlan | McpPlan, declared: frozenset[str],
                   secrets: Secrets) -> Secrets:
    """A secrets lookup limited to `declared`, after checking every reference of the
    plan: undeclared -> E3206, declared but not provided -> E3602."""
    for name in references(plan):
        if name not in declared:
            raise AuthorizationError(
                f"the tool refers to credential {name} without declaring "
                f"'{PREFIX}{name}' in required_permissions", code="E3206",
                details={"credential": name})
        if secrets(name) is None:
            raise ToolexecError(f"credential {name} is not provided to the executor",
                                code="E3602", details={"credential": name})

    def lookup(name: str) -> str | None:
        return secrets(name) if name in declared else None
    return lookup


@dataclass(frozen=True, slots=True)
class CredentialGrants:
    """The operator's grants: credential name -> tool id patterns (an exact tool id,
    `prefix*` for every tool id starting with prefix, e.g. `ns.*`, or `*` for all)."""

    grants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Any) -> CredentialGrants:
        """From the setting's JSON value; ValueError on anything else than a mapping of
        credential names to lists of tool id patterns."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError("credential grants must map credential names to lists of tool ids")
        grants: dict[str, tuple[str, ...]] = {}
        for name, patterns in raw.items():
            if not isinstance(name, str) or not REFERENCE.fullmatch(f"${{{name}}}"):
                raise ValueError(f"credential grants: {name!r} is not a credential name")
            if isinstance(patterns, str) or not isinstance(patterns, list | tuple) or not all(
                    isinstance(p, str) and p and ("*" not in p[:-1]) for p in patterns):
                raise ValueError(f"credential grants: {name} must list tool ids or "
                                 "prefixes ending in '*'")
            grants[name] = tuple(patterns)
        return cls(grants)

    def allows(self, credential: str, tool_id: str) -> bool:
        """True when `credential` is granted to `tool_id`."""
        return any(_names(pattern, tool_id) for pattern in self.grants.get(credential, ()))


def _names(pattern: str, tool_id: str) -> bool:
    if pattern.endswith("*"):
        return tool_id.startswith(pattern[:-1])
    return tool_id == pattern


def grant_holder(chain: ResolvedChain, plan: SubprocessPlan | HttpPlan | McpPlan) -> str:
    """The tool id a grant must name: the MCP server of an MCP plan, else the leaf."""
    if isinstance(plan, McpPlan) and len(chain.links) > 1:
        return chain.links[1].tool_id
    return chain.leaf.tool_id


def granted_secrets(chain: ResolvedChain, plan: SubprocessPlan | HttpPlan | McpPlan,
                    grants: CredentialGrants, secrets: Secrets) -> Secrets:
    """A secrets lookup limited to what the chain declares *and* the operator granted
    its holder, after checking every reference of the plan: undeclared or not granted
    -> E3206, granted but not provided -> E3602."""
    holder = grant_holder(chain, plan)
    declared = declared_credentials(chain)
    for name in references(plan):
        if name in declared and not grants.allows(name, holder):
            raise AuthorizationError(
                f"credential {name} is not granted to {holder} by the operator "
                "(TOOLEXEC_CREDENTIAL_GRANTS); declaring it in required_permissions "
                "is not enough", code="E3206",
                details={"credential": name, "tool_id": holder})
    allowed = frozenset(name for name in declared if grants.allows(name, holder))
    return scoped_secrets(plan, allowed, secrets)
