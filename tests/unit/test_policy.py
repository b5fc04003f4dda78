"""ABAC decisions: defaults, the decision cache, Cedar evaluation, the policy view."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from consumers.adapters.policy_engine import CedarEvaluator, compile_policies
from contracts.envelope import new_envelope
from contracts.events import PolicyUpdated
from domain.errors import AuthorizationError
from domain.policy import AccessRequest, DecisionCache, PolicyBundle, ToolResource, decide
from projections.policy_view import PolicyView

RESOURCE = ToolResource.from_manifest("fetch", "1.2.0", {
    "required_permissions": ["network:egress"], "tags": ["web"], "provider": "acme",
    "tool_type": "api"})
REQUEST = AccessRequest.build("did:a", RESOURCE, {"url": "x", "token": "secret"}, now=100)
FORBID_NET = """
@id("no-egress")
@reason("egress needs review")
forbid(principal, action, resource) when { resource.required_permissions.contains("network:egress") };
permit(principal, action, resource);
"""


def _bundle(text: str, version: str = "1") -> PolicyBundle:
    return PolicyBundle({"main": (version, text)})


def test_request_keeps_parameter_keys_not_values() -> None:
    assert REQUEST.parameter_keys == ("token", "url")


def test_no_policy_loaded_allows_by_default_and_can_deny() -> None:
    evaluator = CedarEvaluator()
    assert decide(REQUEST, None, evaluator, None, clock=0).allowed
    assert not decide(REQUEST, None, evaluator, None, clock=0, default="deny").allowed


def test_forbid_names_the_policy_and_its_reason() -> None:
    decision = CedarEvaluator().evaluate(_bundle(FORBID_NET), REQUEST)
    assert not decision.allowed
    assert decision.reason == "forbidden by no-egress: egress needs review"
    assert decision.policy_version == "main:1"


def test_permit_on_provider_and_tags() -> None:
    text = 'permit(principal, action, resource) when { resource.provider == "acme" ' \
           '&& resource.tags.contains("web") && context.now > 50 };'
    assert CedarEvaluator().evaluate(_bundle(text), REQUEST).allowed


def test_bad_policy_text_is_E3206() -> None:
    with pytest.raises(AuthorizationError) as caught:
        compile_policies("permit(principal, action")
    assert caught.value.code == "E3206"


def test_cache_serves_hits_until_ttl_and_counts_them() -> None:
    cache = DecisionCache(ttl_seconds=300)
    bundle, evaluator = _bundle(FORBID_NET), CedarEvaluator()
    first = decide(REQUEST, bundle, evaluator, cache, clock=0)
    second = decide(REQUEST, bundle, evaluator, cache, clock=299)
    third = decide(REQUEST, bundle, evaluator, cache, clock=300)
    assert (first.cached, second.cached, third.cached) == (False, True, False)
    assert cache.counters()["hits"] == 1 and cache.counters()["misses"] == 2


def test_new_policy_version_is_a_different_cache_key() -> None:
    cache = DecisionCache()
    evaluator = CedarEvaluator()
    decide(REQUEST, _bundle(FORBID_NET, "1"), evaluator, cache, clock=0)
    allowed = decide(REQUEST, _bundle("permit(principal, action, resource);", "2"),
                     evaluator, cache, clock=1)
    assert allowed.allowed and not allowed.cached


def _updated(text: str | list, version: str, set_id: str = "main"):
    return new_envelope(PolicyUpdated(policy_set_id=set_id, version=version, policies=text),
                        source="urn:test", partitionkey=set_id, correlationid=set_id,
                        id=str(uuid.uuid4()), time=datetime.now(UTC))


def test_policy_view_folds_sets_and_invalidates_listeners() -> None:
    cleared: list[int] = []
    view = PolicyView(validate=compile_policies)
    view.on_change(lambda: cleared.append(1))
    assert view.current() is None
    assert view.apply(_updated(FORBID_NET, "1"))
    assert view.apply(_updated("permit(principal, action, resource);", "7", "extra"))
    assert not view.apply(_updated(FORBID_NET, "1"))  # redelivery changes nothing
    assert view.current().version == "extra:7,main:1"
    assert len(cleared) == 2


def test_policy_view_keeps_the_previous_version_when_text_does_not_parse() -> None:
    view = PolicyView(validate=compile_policies)
    view.apply(_updated(FORBID_NET, "1"))
    assert not view.apply(_updated("forbid(", "2"))
    assert view.current().version == "main:1"
