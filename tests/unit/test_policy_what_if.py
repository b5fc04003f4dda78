"""Policy what-if (domain.policy_what_if) with the real Cedar evaluator."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.adapters.policy_engine import CedarEvaluator
from domain.policy import PolicyBundle, ToolResource
from domain.policy_what_if import RecordedDecision, what_if, with_set

PERMIT_ALL = 'permit (principal, action, resource);'
NO_BOB = PERMIT_ALL + '\n@id("no-bob")\nforbid (principal == Agent::"bob", action, resource);'
RESOURCES = {("echo", "1.0.0"): ToolResource("echo", "1.0.0", tool_type="script")}


def resources(tool_id: str, version: str) -> ToolResource | None:
    return RESOURCES.get((tool_id, version))


def recorded(invocation: str, subject: str | None, decision: str = "allow", *,
             code: str | None = None, enforced: bool = True,
             version: str = "1.0.0") -> RecordedDecision:
    return RecordedDecision(invocation, "echo", version, subject, ("text",), 1_700_000_000,
                            decision, enforced, code)  # type: ignore[arg-type]


def bundle(text: str) -> PolicyBundle:
    return PolicyBundle({"rules": ("v", text)})


def test_flips_are_listed_both_ways_and_the_rest_is_not() -> None:
    decisions = [recorded("a1", "ada"), recorded("b1", "bob"),
                 recorded("b2", "bob", "deny", code="E3206")]
    result = what_if(decisions, resources, bundle(NO_BOB), CedarEvaluator())
    assert [(c.invocation_id, c.kind) for c in result.changes] == [("b1", "allow->deny")]
    assert "no-bob" in result.changes[0].reason
    back = what_if(decisions, resources, bundle(PERMIT_ALL), CedarEvaluator())
    assert [(c.invocation_id, c.kind) for c in back.changes] == [("b2", "deny->allow")]
    assert back.by_tool_and_agent() == {("echo", "bob"): {"deny->allow": 1}}
    assert (back.replayed, back.skipped) == (3, 0)


def test_decisions_no_policy_could_change_are_left_out() -> None:
    decisions = [recorded("t1", None, "deny", code="E3203"),  # token refused
                 recorded("t2", "ada", "deny", code="E3204"),  # tool not granted
                 recorded("off", None, enforced=False),  # authorization off
                 recorded("gone", "ada", version="9.9.9")]  # version unknown
    result = what_if(decisions, resources, bundle(NO_BOB), CedarEvaluator())
    assert (result.changes, result.replayed, result.skipped) == ((), 0, 4)


def test_an_empty_candidate_decides_by_the_default() -> None:
    decisions = [recorded("a1", "ada")]
    assert what_if(decisions, resources, PolicyBundle({}), CedarEvaluator(),
                   default="deny").changes[0].kind == "allow->deny"


def test_with_set_replaces_one_set_and_keeps_the_others() -> None:
    both = with_set(PolicyBundle({"base": ("1", PERMIT_ALL), "rules": ("1", NO_BOB)}),
                    "rules", "2", PERMIT_ALL)
    assert dict(both.sets) == {"base": ("1", PERMIT_ALL), "rules": ("2", PERMIT_ALL)}
    assert dict(with_set(None, "rules", "1", NO_BOB).sets) == {"rules": ("1", NO_BOB)}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["ada", "bob", "cy"]), max_size=8))
def test_replaying_against_the_bundle_that_decided_changes_nothing(subjects) -> None:
    """Decisions recorded under a bundle replay to themselves under that bundle."""
    evaluator = CedarEvaluator()
    rules = bundle(NO_BOB)
    decisions = []
    for index, subject in enumerate(subjects):
        allowed = subject != "bob"
        decisions.append(recorded(f"i{index}", subject, "allow" if allowed else "deny",
                                  code=None if allowed else "E3206"))
    assert what_if(decisions, resources, rules, evaluator).changes == ()
    flipped = [replace(d, decision="deny" if d.decision == "allow" else "allow",
                       code="E3206") for d in decisions]
    assert len(what_if(flipped, resources, rules, evaluator).changes) == len(decisions)
