"""The operator's credential grants: a declaration alone grants nothing."""

from __future__ import annotations

import pytest

from domain.credentials import CredentialGrants, grant_holder, granted_secrets
from domain.errors import ToolexecError
from domain.model import ResolvedChain
from domain.plan import build_plan
from tests.unit.chain_builders import builtin, script, tool

HOST = {"API_TOKEN": "tok-123456", "OTHER": "other-secret"}


def _chain(tool_id: str = "hello") -> ResolvedChain:
    leaf = script(tool_id, config={"entrypoint": "main.py", "env": {"T": "${API_TOKEN}"}},
                  required_permissions=["credentials:API_TOKEN"])
    return ResolvedChain((leaf, builtin("python_runtime"), builtin("subprocess")))


def test_without_a_grant_a_declared_credential_is_refused_with_E3206() -> None:
    chain = _chain()
    with pytest.raises(ToolexecError) as refused:
        granted_secrets(chain, build_plan(chain), CredentialGrants(), HOST.get)
    assert refused.value.code == "E3206" and "not granted" in refused.value.message
    assert "tok-123456" not in str(refused.value)


@pytest.mark.parametrize("pattern", ["hello", "hel*", "*"])
def test_a_grant_names_the_tool_a_prefix_or_every_tool(pattern: str) -> None:
    chain = _chain()
    lookup = granted_secrets(chain, build_plan(chain),
                             CredentialGrants({"API_TOKEN": (pattern,)}), HOST.get)
    assert lookup("API_TOKEN") == "tok-123456"
    assert lookup("OTHER") is None


def test_a_grant_for_another_tool_does_not_apply() -> None:
    chain = _chain("hello_evil")
    with pytest.raises(ToolexecError):
        granted_secrets(chain, build_plan(chain),
                        CredentialGrants({"API_TOKEN": ("hello", "ns.*")}), HOST.get)


def test_a_grant_does_not_replace_the_declaration() -> None:
    leaf = script(config={"entrypoint": "main.py", "env": {"T": "${API_TOKEN}"}})
    chain = ResolvedChain((leaf, builtin("python_runtime"), builtin("subprocess")))
    with pytest.raises(ToolexecError) as refused:
        granted_secrets(chain, build_plan(chain), CredentialGrants({"API_TOKEN": ("*",)}),
                        HOST.get)
    assert "without declaring" in refused.value.message


def test_an_mcp_tool_s_credential_is_granted_to_its_server() -> None:
    server = tool("gh_server", tool_type="mcp_server", executor="subprocess",
                  config={"transport": "stdio", "command": "python3",
                          "env": {"KEY": "${API_TOKEN}"}},
                  required_permissions=["credentials:API_TOKEN"])
    mcp_tool = tool("gh_issue", tool_type="mcp_tool", executor="gh_server",
                    config={"mcp_tool_name": "issue"})
    chain = ResolvedChain((mcp_tool, server, builtin("subprocess")))
    plan = build_plan(chain)
    assert grant_holder(chain, plan) == "gh_server"
    granted_secrets(chain, plan, CredentialGrants({"API_TOKEN": ("gh_server",)}), HOST.get)


@pytest.mark.parametrize("raw", [["x"], {"A": "tool"}, {"A": [1]}, {"bad name": ["t"]},
                                 {"A": ["a*b"]}])
def test_malformed_grants_are_refused(raw: object) -> None:
    with pytest.raises(ValueError):
        CredentialGrants.parse(raw)
