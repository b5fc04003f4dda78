"""An external ABAC engine as the policy decision point (spec 11.3.3).

With `TOOLEXEC_ABAC_URL` set, the authorize step asks `POST {url}/v1/authorize`
instead of evaluating Cedar in-process. The engine answers
`{"decision": "allow"|"deny", "reason": ..., "obligations": [...]}`. An engine that
cannot be reached, errs or answers anything else is E3205: nothing runs on a
decision that could not be made.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx

from domain.errors import AuthorizationError
from domain.policy import EXTERNAL_VERSION, AccessRequest, PolicyDecision


class HttpAbac:
    """Client of an external ABAC engine; one pooled connection set per process."""

    def __init__(self, url: str, *, timeout_seconds: float = 2.0,
                 client: httpx.AsyncClient | None = None) -> None:
        self.url = url.rstrip("/") + "/v1/authorize"
        self._client = client or httpx.AsyncClient(timeout=timeout_seconds)

    async def evaluate(self, request: AccessRequest) -> PolicyDecision:
        """The engine's decision; raises AuthorizationError E3205 when there is none."""
        try:
            response = await self._client.post(self.url, json=abac_request(request))
            response.raise_for_status()
            answer = response.json()
        except (httpx.HTTPError, ValueError) as error:
            raise _engine_error(f"{type(error).__name__}: {error}") from error
        decision = answer.get("decision") if isinstance(answer, dict) else None
        if decision not in ("allow", "deny"):
            raise _engine_error(f"unexpected answer {str(answer)[:200]!r}")
        return PolicyDecision(allowed=decision == "allow", reason=str(answer.get("reason", "")),
                              policy_version=EXTERNAL_VERSION)

    async def aclose(self) -> None:
        await self._client.aclose()


def abac_request(request: AccessRequest) -> dict[str, Any]:
    """The body of `POST /v1/authorize`: parameter keys only, never their values."""
    resource = request.resource
    return {
        "subject": request.subject,
        "action": "tool.invoke",
        "resource": f"tool:{resource.tool_id}:{resource.version}",
        "context": {
            "required_permissions": list(resource.required_permissions),
            "tags": list(resource.tags), "provider": resource.provider,
            "tool_type": resource.tool_type, "parameter_keys": list(request.parameter_keys),
            "timestamp": datetime.fromtimestamp(request.now, UTC).isoformat(),
        },
    }


def _engine_error(reason: str) -> AuthorizationError:
    return AuthorizationError(f"ABAC engine error: {reason}", code="E3205",
                              details={"policy_version": EXTERNAL_VERSION})
