"""The gateway of a `toolexec up` that requires capability tokens: the bearer token is
the invocation's `captoken`, and the pipeline's decision becomes the HTTP status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import mcp_types
import pytest

from tests.cli_process import toolexec
from tests.integration.gateway_support import RunningGateway, running_gateway, wait_until
from toolexec.gateway.mcp import Gateway, build_server
from toolexec.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.security]

ECHO = {"text": "secret handshake"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("secured-gateway"),
                         env={"TOOLEXEC_REQUIRE_AUTH": "true"}) as running:
        yield running


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_without_a_token_the_invocation_is_401(secured) -> None:
    response = secured.invoke("py_echo", ECHO)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "E3203"


def test_a_forged_token_is_401(secured) -> None:
    header, payload, signature = secured.token("py_echo@^1").split(".")
    response = secured.invoke("py_echo", ECHO,
                              headers=bearer(f"{header}.{payload}.{signature[::-1]}"))
    assert response.status_code == 401
    assert response.json()["error"]["code"] in ("E3202", "E3203")


def test_a_token_for_another_tool_is_403(secured) -> None:
    response = secured.invoke("py_echo", ECHO, headers=bearer(secured.token("hello@^1")))
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "E3204"


def test_a_valid_token_runs_the_tool_and_its_subject_is_recorded(secured) -> None:
    token = secured.token("py_echo@^1")
    response = secured.invoke("py_echo", ECHO, headers=bearer(token))
    assert response.status_code == 200, response.text
    view = secured.http.get(f"/v1/invocations/{response.json()['invocation_id']}",
                            headers=bearer(token)).json()
    assert view["status"] == "completed" and view["subject"] == "did:example:gateway-test"


def test_registering_needs_a_token_with_the_publish_scope(secured) -> None:
    manifest = {"tool_id": "guarded", "version": "1.0.0", "tool_type": "script",
                "executor": "python_runtime", "config": {"entrypoint": "main.py"},
                "description": "Registered only with a token."}
    files = [{"path": "main.py", "content": "print('{}')\n"}]
    refused = secured.register(manifest, files)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "E3203"
    invoker = secured.register(manifest, files, headers=bearer(secured.token("py_echo@^1")))
    assert invoker.status_code == 403 and invoker.json()["error"]["code"] == "E3206"
    accepted = secured.register(manifest, files, headers=bearer(
        secured.token(scopes=("--publish", "guarded"))))
    assert accepted.status_code == 201, accepted.text
    shown = secured.http.get("/v1/tools/guarded").json()["tool"]
    assert shown["versions"][0]["published_by"] == "did:example:gateway-test"


def test_cancelling_needs_a_token_of_the_invocations_subject(secured) -> None:
    done = secured.invoke("py_echo", ECHO, headers=bearer(secured.token("py_echo@^1")))
    cancel = f"/v1/invocations/{done.json()['invocation_id']}/cancel"
    refused = secured.http.post(cancel)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "E3203"
    issued = toolexec("token", "issue", "--sub", "did:example:someone-else", "--tool",
                      "py_echo@^1", "--ttl", "300", "--json", cwd=secured.cwd, env=secured.env)
    stranger = json.loads(issued.stdout)["token"]
    forbidden = secured.http.post(cancel, headers=bearer(stranger))
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "E3206"
    owner = secured.http.post(cancel, headers=bearer(secured.token("py_echo@^1")))
    assert owner.status_code == 200  # allowed to ask; a no-op, as it already ended
    assert owner.json()["status"] == "already_ended"


def test_changing_a_lifecycle_needs_a_token_with_the_lifecycle_scope(secured) -> None:
    url, body = "/v1/tools/sh_upper/lifecycle", {"version": "1.0.0", "state": "deprecated"}
    refused = secured.http.post(url, json=body)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "E3203"
    forged = secured.http.post(url, json=body, headers=bearer("e30.e30.bm9wZQ"))
    assert forged.status_code == 401
    invoker = secured.http.post(url, json=body, headers=bearer(secured.token("sh_upper@^1")))
    assert invoker.status_code == 403 and invoker.json()["error"]["code"] == "E3206"
    accepted = secured.http.post(url, json=body, headers=bearer(
        secured.token(scopes=("--lifecycle", "sh_*"))))
    assert accepted.status_code == 200, accepted.text
    shown = secured.http.get("/v1/tools/sh_upper").json()["tool"]
    assert [v["lifecycle"] for v in shown["versions"]] == ["deprecated"]


def _mcp_status(secured: RunningGateway, invocation_id: str, token: str | None) -> Any:
    """The MCP `execute` tool's `status` answer: the document, or the error body."""
    async def call() -> Any:
        server = build_server(Gateway(Settings(state_dir=secured.cwd / ".toolexec"), []))
        result = await server.call_tool("execute", {
            "action": "status", "invocation_id": invocation_id, "token": token})
        return json.loads(next(b.text for b in result.content
                               if isinstance(b, mcp_types.TextContent)))
    return anyio.run(call)


def _http_status(secured: RunningGateway, invocation_id: str, token: str | None) -> Any:
    return secured.http.get(f"/v1/invocations/{invocation_id}",
                            headers=bearer(token) if token else {}).json()


def _refusal(answer: Any) -> str | None:
    """The code of an error answer; None for an invocation shown (`error` None)."""
    return (answer.get("error") or {}).get("code") if "status" not in answer else None


def test_reading_an_invocation_needs_the_same_rights_over_http_and_mcp(secured) -> None:
    owner = secured.token("py_echo@^1")
    done = secured.invoke("py_echo", ECHO, headers=bearer(owner))
    invocation_id = done.json()["invocation_id"]
    wait_until(lambda: _http_status(secured, invocation_id, owner).get("status") == "completed")
    issued = toolexec("token", "issue", "--sub", "did:example:someone-else", "--tool",
                      "py_echo@^1", "--ttl", "300", "--json", cwd=secured.cwd, env=secured.env)
    stranger = json.loads(issued.stdout)["token"]
    for token, code in [(None, "E3203"), ("e30.e30.bm9wZQ", "E3203"), (stranger, "E3206")]:
        assert _refusal(_http_status(secured, invocation_id, token)) == code
        assert _refusal(_mcp_status(secured, invocation_id, token)) == code
    for reader in (owner, secured.token(scopes=("--audit",))):  # its subject, an auditor
        assert _http_status(secured, invocation_id, reader)["status"] == "completed"
        shown = _mcp_status(secured, invocation_id, reader)
        assert shown["status"] == "completed" and shown["invocation_id"] == invocation_id
