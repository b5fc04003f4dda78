"""Door 1, runtime hijack: a token allowed to invoke one tool published a newer
`python_runtime` with its own base_args, and every Python tool of every caller ran it.
Now runtimes (and primitives, MCP servers) take admin rights, every published version
runs on the executor version it was published with, and versions never change."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cli_process import toolexec
from tests.integration.gateway_support import RunningGateway
from tests.security.rights_support import (
    TOOLS,
    bearer,
    manifest_of,
    script_tool,
    secured_gateway,
    sign,
)

pytestmark = [pytest.mark.integration, pytest.mark.security]

HIJACK = TOOLS / "hijack_runtime"
BARE = TOOLS / "bare_runtime"
ADA = {"name": "Ada"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    yield from secured_gateway(tmp_path_factory, "publish-rights")


def _hello(secured: RunningGateway) -> dict:
    token = sign(secured.cwd, sub="did:example:ada", tools=[("hello", "^1")])
    response = secured.invoke("hello", ADA, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


def _chain_of(secured: RunningGateway, invocation_id: str) -> list[str]:
    auditor = sign(secured.cwd, sub="did:example:auditor", scopes={"audit": True})
    page = secured.http.get("/v1/audit", params={"invocation": invocation_id,
                                                  "type": "tool.chain.resolved"},
                            headers=bearer(auditor)).json()
    [record] = page["records"]
    return [f"{link['tool_id']}@{link['version']}" for link in record["event"]["data"]["chain"]]


def _versions(secured: RunningGateway, tool_id: str) -> list[str]:
    return [v["version"] for v in secured.http.get(f"/v1/tools/{tool_id}").json()["tool"]["versions"]]


def test_a_token_for_one_tool_cannot_publish_a_runtime(secured) -> None:
    mallory = sign(secured.cwd, sub="did:example:mallory", tools=[("hello", "^1")])
    through_http = secured.register(manifest_of(HIJACK), [], headers=bearer(mallory))
    assert through_http.status_code == 403, through_http.text
    assert through_http.json()["error"]["code"] == "E3206"
    through_cli = toolexec("publish", str(HIJACK), "--token", mallory, "--json",
                           cwd=secured.cwd, env=secured.env)
    assert through_cli.returncode == 1, through_cli.stdout
    assert json.loads(through_cli.stdout)["error"]["code"] == "E3206"
    assert "1.0.2" not in _versions(secured, "python_runtime")
    assert _hello(secured)["result"] == {"greeting": "Hello, Ada!"}


def test_publish_rights_end_at_their_namespace_and_never_reach_runtimes(secured) -> None:
    acme = sign(secured.cwd, sub="did:example:acme", scopes={"publish": ["acme_*"]})
    assert secured.register(*script_tool("acme_greeter"), headers=bearer(acme)).status_code == 201
    other = secured.register(*script_tool("other_greeter"), headers=bearer(acme))
    assert other.status_code == 403 and other.json()["error"]["code"] == "E3206"
    everything = sign(secured.cwd, sub="did:example:acme",
                      scopes={"publish": ["*"], "lifecycle": ["*"], "audit": True})
    runtime = secured.register(manifest_of(HIJACK), [], headers=bearer(everything))
    assert runtime.status_code == 403 and "admin" in runtime.json()["error"]["message"]


def test_a_newer_runtime_from_an_admin_changes_no_existing_tool(secured) -> None:
    admin = sign(secured.cwd, sub="did:example:ops", scopes={"admin": True})
    published = secured.register(manifest_of(HIJACK), [], headers=bearer(admin))
    assert published.status_code == 201, published.text
    assert published.json()["executor_pin"] == "subprocess@1.0.0"
    done = _hello(secured)
    assert done["result"] == {"greeting": "Hello, Ada!"}
    assert _chain_of(secured, done["invocation_id"]) == [
        "hello@1.0.0", "python_runtime@1.0.0", "subprocess@1.0.0"]
    # Moving to the new runtime is a new version of a tool: published now, it pins it.
    publisher = sign(secured.cwd, sub="did:example:acme", scopes={"publish": ["acme_*"]})
    newer = secured.register(*script_tool("acme_newcomer"), headers=bearer(publisher))
    assert newer.status_code == 201 and newer.json()["executor_pin"] == "python_runtime@1.0.2"


def test_a_newer_runtime_without_child_schemas_breaks_no_existing_tool(secured) -> None:
    admin = sign(secured.cwd, sub="did:example:ops", scopes={"admin": True})
    published = secured.register(manifest_of(BARE), [], headers=bearer(admin))
    assert published.status_code == 201, published.text
    assert _hello(secured)["result"] == {"greeting": "Hello, Ada!"}


def test_a_published_version_never_changes(secured) -> None:
    acme = bearer(sign(secured.cwd, sub="did:example:acme", scopes={"publish": ["acme_*"]}))
    first = secured.register(*script_tool("acme_fixed", greeting="first"), headers=acme)
    assert first.status_code == 201, first.text
    again = secured.register(*script_tool("acme_fixed", greeting="first"), headers=acme)
    assert again.status_code == 200 and again.json()["status"] == "unchanged"
    assert again.json()["event_id"] == first.json()["event_id"]
    changed = secured.register(*script_tool("acme_fixed", greeting="second"), headers=acme)
    assert changed.status_code == 409 and changed.json()["error"]["code"] == "E3103"
    [version] = secured.http.get("/v1/tools/acme_fixed").json()["tool"]["versions"]
    assert version["integrity"] == first.json()["integrity"]
