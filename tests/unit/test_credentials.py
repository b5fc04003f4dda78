from __future__ import annotations

import pytest

from domain.credentials import declared_credentials, references, scoped_secrets
from domain.errors import ToolexecError
from domain.model import ResolvedChain
from domain.plan import build_plan
from tests.unit.chain_builders import builtin, script, tool

HOST = {"API_TOKEN": "tok-123456", "AWS_SECRET_ACCESS_KEY": "host-secret"}


def _chain(env: dict[str, str], permissions: list[str]) -> ResolvedChain:
    leaf = script(config={"entrypoint": "main.py", "env": env},
                  required_permissions=permissions)
    return ResolvedChain((leaf, builtin("python_runtime"), builtin("subprocess")))


def test_declared_credentials_come_from_every_link_of_the_chain() -> None:
    chain = _chain({}, ["credentials:API_TOKEN", "network:api.example.com"])
    assert declared_credentials(chain) == {"API_TOKEN"}


def test_a_declared_credential_is_available_and_nothing_else() -> None:
    chain = _chain({"T": "${API_TOKEN}"}, ["credentials:API_TOKEN"])
    lookup = scoped_secrets(build_plan(chain), declared_credentials(chain), HOST.get)
    assert lookup("API_TOKEN") == "tok-123456"
    assert lookup("AWS_SECRET_ACCESS_KEY") is None


def test_an_undeclared_reference_is_refused_with_E3206() -> None:
    chain = _chain({"K": "${AWS_SECRET_ACCESS_KEY}"}, ["credentials:API_TOKEN"])
    with pytest.raises(ToolexecError) as caught:
        scoped_secrets(build_plan(chain), declared_credentials(chain), HOST.get)
    assert caught.value.code == "E3206"
    assert "host-secret" not in str(caught.value)


def test_a_declared_credential_the_executor_lacks_is_E3602() -> None:
    chain = _chain({"K": "${MISSING}"}, ["credentials:MISSING"])
    with pytest.raises(ToolexecError) as caught:
        scoped_secrets(build_plan(chain), declared_credentials(chain), HOST.get)
    assert caught.value.code == "E3602"


def test_http_header_references_are_checked_too() -> None:
    api = tool("weather", tool_type="api", executor="http_client",
               config={"method": "GET", "url_template": "https://api.example.com/x",
                       "headers": {"Authorization": "Bearer ${AWS_SECRET_ACCESS_KEY}"}})
    plan = build_plan(ResolvedChain((api, builtin("http_client"))))
    assert references(plan) == ["AWS_SECRET_ACCESS_KEY"]
    with pytest.raises(ToolexecError) as caught:
        scoped_secrets(plan, frozenset(), HOST.get)
    assert caught.value.code == "E3206"
