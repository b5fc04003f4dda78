"""Which credentials a tool may receive: only those its chain declares.

A plan refers to a credential as `${NAME}` in a subprocess environment value or an
HTTP header. The reference is honoured only when a manifest of the chain lists
`credentials:NAME` in `required_permissions`; otherwise a published tool could ask
for any secret the executor holds (a cloud key in its environment, say).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

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
