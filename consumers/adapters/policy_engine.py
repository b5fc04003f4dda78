"""Cedar (PyPI `cedarpy`) behind the `PolicyEvaluator` port.

Entity model of a request:
- principal `Agent::"<token sub>"`;
- action `Action::"tool.invoke"`;
- resource `Tool::"<tool_id>@<version>"` with attributes `tool_id`, `version`,
  `required_permissions` (set of strings), `tags` (set), `provider`, `tool_type`;
- context `{parameter_keys: [..], now: <unix seconds>}`.

Policies may carry `@id("...")` and `@reason("...")` annotations; a deny names the
forbid policies that matched with those annotations (or says no permit matched). A
permit annotated `@approval("required")` that matches makes the allowed call wait for
an approver (domain.approval).
Parsed policy sets are kept per bundle version, so each version is parsed once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import cedarpy

from domain.approval import requires_approval
from domain.errors import AuthorizationError
from domain.policy import ACTION, AccessRequest, PolicyBundle, PolicyDecision


@dataclass(frozen=True)
class CompiledPolicies:
    """A parsed Cedar policy set and the annotations of each policy, by Cedar id."""

    policy_set: Any
    annotations: dict[str, dict[str, str]]


def compile_policies(text: str) -> CompiledPolicies:
    """Parse Cedar policy text. Raises AuthorizationError (E3206) when it does not parse."""
    try:
        policy_set = cedarpy.PolicySet.from_str(text)
        as_json = json.loads(cedarpy.policies_to_json_str(text))
    except (ValueError, RuntimeError) as error:
        raise AuthorizationError(f"policy text does not parse: {error}", code="E3206") from error
    annotations = {pid: dict(body.get("annotations") or {})
                   for pid, body in (as_json.get("staticPolicies") or {}).items()}
    return CompiledPolicies(policy_set, annotations)


def cedar_text_from_json(policies: list[dict[str, Any]]) -> str:
    """Cedar text of policies in Cedar's JSON form (one object per policy)."""
    document = {"staticPolicies": {str(p.get("id", f"p{i}")): {k: v for k, v in p.items()
                                                                if k != "id"}
                                   for i, p in enumerate(policies)},
                "templates": {}, "templateLinks": []}
    try:
        return str(cedarpy.policies_from_json_str(json.dumps(document)))
    except (ValueError, RuntimeError) as error:
        raise AuthorizationError(f"policy JSON does not parse: {error}", code="E3206") from error


@dataclass
class CedarEvaluator:
    """PolicyEvaluator implemented with cedarpy, in-process."""

    _compiled: dict[str, CompiledPolicies] = field(default_factory=dict)

    def evaluate(self, bundle: PolicyBundle, request: AccessRequest) -> PolicyDecision:
        compiled = self._compiled_for(bundle)
        resource = request.resource
        result = cedarpy.is_authorized(
            {"principal": {"type": "Agent", "id": request.subject},
             "action": {"type": "Action", "id": ACTION},
             "resource": {"type": "Tool", "id": resource.uid},
             "context": {"parameter_keys": list(request.parameter_keys), "now": request.now}},
            compiled.policy_set,
            [_resource_entity(request)],
        )
        ids = tuple(result.diagnostics.reasons)
        if result.allowed:
            approval = tuple(_describe(i, compiled) for i in ids
                             if requires_approval(compiled.annotations.get(i, {})))
            return PolicyDecision(True, _allow_reason(ids, compiled), bundle.version, ids,
                                  approval=approval)
        return PolicyDecision(False, _deny_reason(ids, compiled, list(result.diagnostics.errors)),
                              bundle.version, ids)

    def _compiled_for(self, bundle: PolicyBundle) -> CompiledPolicies:
        compiled = self._compiled.get(bundle.version)
        if compiled is None:
            compiled = compile_policies(bundle.text)
            self._compiled = {bundle.version: compiled}  # only the current version is kept
        return compiled


def _resource_entity(request: AccessRequest) -> dict[str, Any]:
    r = request.resource
    return {"uid": {"__entity": {"type": "Tool", "id": r.uid}},
            "attrs": {"tool_id": r.tool_id, "version": r.version,
                      "required_permissions": list(r.required_permissions),
                      "tags": list(r.tags), "provider": r.provider, "tool_type": r.tool_type},
            "parents": []}


def _describe(policy_id: str, compiled: CompiledPolicies) -> str:
    notes = compiled.annotations.get(policy_id, {})
    name = notes.get("id", policy_id)
    return f"{name}: {notes['reason']}" if "reason" in notes else name


def _allow_reason(ids: tuple[str, ...], compiled: CompiledPolicies) -> str:
    return "permitted by " + "; ".join(_describe(i, compiled) for i in ids)


def _deny_reason(ids: tuple[str, ...], compiled: CompiledPolicies, errors: list[Any]) -> str:
    if ids:
        return "forbidden by " + "; ".join(_describe(i, compiled) for i in ids)
    reason = "no policy permits this invocation"
    if errors:
        reason += f" ({len(errors)} policy evaluation error(s): {errors[0]})"
    return reason
