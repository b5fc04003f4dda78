"""The sample policies shipped under examples/policies/ (docs/policies.md) parse and
decide as their comments say, on the entity model the pipeline builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.adapters.policy_engine import CedarEvaluator
from domain.policy import AccessRequest, PolicyBundle, ToolResource

POLICIES = Path(__file__).resolve().parents[2] / "examples" / "policies"


def _decide(policy: str, subject: str, resource: ToolResource,
            parameters: dict[str, object] | None = None) -> tuple[bool, str]:
    text = (POLICIES / policy).read_text()
    bundle = PolicyBundle({Path(policy).stem: ("v1", text)})
    decision = CedarEvaluator().evaluate(
        bundle, AccessRequest.build(subject, resource, parameters or {}, now=0))
    return decision.allowed, decision.reason


HELLO = ToolResource("hello", "1.0.0", tags=("example", "demo"), tool_type="script")
WORDS = ToolResource("word_stats", "1.1.0", tags=("example", "text"), tool_type="script")
FETCH = ToolResource("acme_fetch", "1.0.0", tool_type="api")


def test_no_demo_forbids_demo_tagged_tools_and_names_the_reason() -> None:
    allowed, reason = _decide("no_demo.cedar", "did:example:ada", HELLO)
    assert not allowed and "demo tools do not run" in reason
    assert _decide("no_demo.cedar", "did:example:ada", WORDS)[0]


@pytest.mark.parametrize(("subject", "parameters", "allowed"), [
    ("did:example:fetcher", {"text": "x"}, True),
    ("did:example:fetcher", {"url": "x"}, False),
    ("did:example:ada", {"text": "x"}, False),
])
def test_api_callers_limits_api_tools_to_one_agent(subject: str, parameters: dict[str, object],
                                                   allowed: bool) -> None:
    assert _decide("api_callers.cedar", subject, FETCH, parameters)[0] is allowed
    assert _decide("api_callers.cedar", subject, WORDS, parameters)[0]


def test_every_sample_policy_file_is_covered_here() -> None:
    assert {p.name for p in POLICIES.glob("*.cedar")} == {"no_demo.cedar", "api_callers.cedar"}
