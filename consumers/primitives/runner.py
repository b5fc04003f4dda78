"""The PrimitiveRunner adapter: dispatches a plan to the one primitive that runs it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from consumers.primitives.file_store import ContentStore
from consumers.primitives.host_groups import host_groups
from consumers.primitives.http_primitive import HttpPrimitive
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.model import HttpPlan, McpPlan, PrimitiveOutcome, SubprocessPlan
from domain.sandbox_policy import SandboxPolicy, narrow_plan

if TYPE_CHECKING:
    from consumers.ports import ToolSession
    from consumers.primitives.mcp_servers import McpServers

log = structlog.get_logger(__name__)


class Primitives:
    """Runs subprocess plans in fresh work dirs, HTTP plans on one pooled client, and MCP
    plans on long-lived servers started (or reached) through those two primitives —
    each under the operator's SandboxPolicy (ceilings, egress allowances, protected
    paths, per-run uids)."""

    def __init__(self, store: ContentStore, work_root: Path, *, sandbox: str = "rlimits",
                 policy: SandboxPolicy | None = None) -> None:
        self._store = store
        self._work_root = work_root
        host_groups(work_root)  # first use: kills what an executor that died here left
        self._sandbox = sandbox
        self._policy = policy or SandboxPolicy()
        self._http = HttpPrimitive(allowed_networks=self._policy.egress_allowed_networks)
        self._mcp: McpServers | None = None

    @property
    def sandbox(self) -> str:
        return self._sandbox

    @property
    def policy(self) -> SandboxPolicy:
        return self._policy

    async def run(self, plan: SubprocessPlan | HttpPlan | McpPlan, params: Mapping[str, Any], *,
                  secrets: Callable[[str], str | None],
                  session: ToolSession | None = None) -> PrimitiveOutcome:
        """Run `plan`; `session` receives a subprocess tool's reports (the others
        have none)."""
        if isinstance(plan, SubprocessPlan):
            return await run_subprocess(plan, params, store=self._store,
                                        work_root=self._work_root, sandbox=self._sandbox,
                                        policy=self._policy, session=session)
        narrowed, cuts = narrow_plan(plan, self._policy)
        if cuts:
            log.info("sandbox.limits_narrowed", narrowed=[cut.to_dict() for cut in cuts])
        if isinstance(narrowed, McpPlan):
            return await self.mcp.run(narrowed, params, secrets=secrets)
        assert isinstance(narrowed, HttpPlan)
        return await self._http.run(narrowed, params, secrets=secrets)

    async def definition(self, plan: McpPlan, *,
                         secrets: Callable[[str], str | None]) -> Mapping[str, Any] | None:
        """The plan's MCP tool as its server announces it (the AnnouncedDefinitions
        port), on the connection the narrowed plan's calls use."""
        narrowed, _cuts = narrow_plan(plan, self._policy)
        assert isinstance(narrowed, McpPlan)
        return await self.mcp.definition(narrowed, secrets=secrets)

    @property
    def mcp(self) -> McpServers:
        """The live MCP servers (the MCP SDK is imported on the first MCP call)."""
        if self._mcp is None:
            from consumers.primitives.mcp_servers import McpServers

            self._mcp = McpServers(self._store, self._work_root, sandbox=self._sandbox,
                                   policy=self._policy)
        return self._mcp

    async def aclose(self) -> None:
        if self._mcp is not None:
            await self._mcp.aclose()
        await self._http.aclose()
