from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.scopes import (
    AUDIT_NEED,
    POLICY_NEED,
    ScopeClaimError,
    Scopes,
    approve_need,
    is_namespace,
    lifecycle_need,
    missing,
    namespace_covers,
    parse_scopes,
    publish_need,
)

TOOL_IDS = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)


def test_a_token_without_scopes_grants_none_of_them() -> None:
    scopes = parse_scopes(None)
    for need in (publish_need("hello", "script"), lifecycle_need("hello"), POLICY_NEED,
                 AUDIT_NEED, approve_need("hello")):
        assert missing(scopes, need) is not None


def test_the_claim_round_trips() -> None:
    scopes = Scopes(publish=("acme_*",), lifecycle=("hello",), approve=("*",), policy=True,
                    audit=True)
    assert parse_scopes(scopes.to_claim()) == scopes
    assert Scopes().to_claim() == {} and Scopes().empty


@pytest.mark.parametrize("claim", [
    [], "publish", {"publsh": ["x"]}, {"publish": "acme_*"}, {"publish": ["Acme"]},
    {"publish": ["acme.*"]}, {"publish": ["a*b"]}, {"admin": "yes"}, {"audit": 1},
])
def test_a_malformed_claim_is_refused(claim: object) -> None:
    with pytest.raises(ScopeClaimError):
        parse_scopes(claim)


def test_publish_is_granted_per_namespace() -> None:
    scopes = Scopes(publish=("acme_*", "hello"))
    assert missing(scopes, publish_need("acme_fetch", "script")) is None
    assert missing(scopes, publish_need("hello", "api")) is None
    assert missing(scopes, publish_need("hellos", "script")) is not None
    assert missing(scopes, publish_need("acm", "script")) is not None


@pytest.mark.parametrize("tool_type", ["runtime", "primitive", "mcp_server"])
def test_runtimes_primitives_and_mcp_servers_need_admin(tool_type: str) -> None:
    everything = Scopes(publish=("*",), lifecycle=("*",), policy=True, audit=True)
    assert "admin" in (missing(everything, publish_need("python_runtime", tool_type)) or "")
    assert missing(Scopes(admin=True), publish_need("python_runtime", tool_type)) is None


def test_a_script_under_a_runtimes_tool_id_still_needs_admin() -> None:
    need = publish_need("python_runtime", "script", existing_types={"runtime"})
    assert need.admin
    assert missing(Scopes(publish=("*",)), need) is not None


def test_retiring_a_runtime_needs_admin() -> None:
    need = lifecycle_need("python_runtime", ["runtime"])
    assert missing(Scopes(lifecycle=("*",)), need) is not None
    assert missing(Scopes(lifecycle=("*",)), lifecycle_need("hello", ["script"])) is None


def test_admin_grants_every_scope_but_flags_need_their_own_grant() -> None:
    admin = Scopes(admin=True)
    for need in (POLICY_NEED, AUDIT_NEED, approve_need("x"), lifecycle_need("x")):
        assert missing(admin, need) is None
    assert missing(Scopes(audit=True), POLICY_NEED) is not None
    assert missing(Scopes(policy=True), POLICY_NEED) is None


def test_a_source_without_a_tool_id_takes_any_publish_grant() -> None:
    assert missing(Scopes(publish=("acme_*",)), publish_need(None, None)) is None
    assert missing(Scopes(lifecycle=("*",)), publish_need(None, None)) is not None


@given(prefix=TOOL_IDS, rest=st.from_regex(r"[a-z0-9_]{0,10}", fullmatch=True))
def test_a_prefix_pattern_covers_every_id_it_starts(prefix: str, rest: str) -> None:
    assert is_namespace(prefix + "*")
    assert namespace_covers(prefix + "*", prefix + rest)
    assert namespace_covers("*", prefix + rest)


@given(granted=TOOL_IDS, asked=TOOL_IDS)
def test_an_exact_pattern_covers_only_its_own_id(granted: str, asked: str) -> None:
    assert namespace_covers(granted, asked) == (granted == asked)
