"""Door 7, authorization gaps (auth on): any valid token deprecated or removed any tool;
the CLI's write commands worked with no token at all; the audit trail, invocation
status and the status page answered every caller's parameters and results to anyone;
tokens with `exp: 1e30` or a future `iat` were accepted."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli_process import toolexec
from tests.integration.gateway_support import EXAMPLES, RunningGateway
from tests.security.rights_support import bearer, secured_gateway, sign
from tests.waiting import WAIT

pytestmark = [pytest.mark.integration, pytest.mark.security]

SECRET = {"text": "ada's secret"}
PERMIT_ALL = "permit(principal, action, resource);\n"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    yield from secured_gateway(tmp_path_factory, "authorization-gaps")


@pytest.fixture(scope="module")
def adas_invocation(secured: RunningGateway) -> str:
    """An invocation of py_echo by did:example:ada, with a parameter worth hiding."""
    ada = sign(secured.cwd, sub="did:example:ada", tools=[("py_echo", "^1")])
    done = secured.invoke("py_echo", SECRET, headers=bearer(ada))
    assert done.status_code == 200, done.text
    return done.json()["invocation_id"]


def _token(secured: RunningGateway, sub: str, **scopes: object) -> str:
    return sign(secured.cwd, sub=sub, tools=[("py_echo", "^1")], scopes=scopes or None)


def _cli(secured: RunningGateway, *args: str) -> tuple[int, dict]:
    done = toolexec(*args, "--json", cwd=secured.cwd, env=secured.env)
    return done.returncode, json.loads(done.stdout or "{}")


# --- writes ----------------------------------------------------------------------------


def test_deprecating_a_tool_takes_the_lifecycle_scope_on_it(secured) -> None:
    url, body = "/v1/tools/sh_upper/lifecycle", {"version": "1.0.0", "state": "deprecated"}
    anyone = secured.http.post(url, json=body, headers=bearer(_token(secured, "did:example:x")))
    assert anyone.status_code == 403 and anyone.json()["error"]["code"] == "E3206"
    elsewhere = _token(secured, "did:example:x", lifecycle=["acme_*"])
    assert secured.http.post(url, json=body, headers=bearer(elsewhere)).status_code == 403
    owner = _token(secured, "did:example:x", lifecycle=["sh_*"])
    assert secured.http.post(url, json=body, headers=bearer(owner)).status_code == 200


def test_retiring_a_runtime_takes_admin(secured) -> None:
    url = "/v1/tools/python_runtime/lifecycle"
    body = {"version": "1.0.0", "state": "removed"}
    every_tool = _token(secured, "did:example:x", lifecycle=["*"])
    refused = secured.http.post(url, json=body, headers=bearer(every_tool))
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    assert secured.http.get("/v1/tools/python_runtime").json()["tool"]["versions"][0][
        "lifecycle"] == "active"


def test_cli_deprecate_needs_a_token_with_the_lifecycle_scope(secured) -> None:
    code, body = _cli(secured, "deprecate", "word_stats@1.1.0")
    assert code == 1 and body["error"]["code"] == "E3203"
    code, body = _cli(secured, "deprecate", "word_stats@1.1.0",
                      "--token", _token(secured, "did:example:x"))
    assert code == 1 and body["error"]["code"] == "E3206"
    code, body = _cli(secured, "deprecate", "word_stats@1.1.0",
                      "--token", _token(secured, "did:example:x", lifecycle=["word_*"]))
    assert code == 0 and body["lifecycle"] == "deprecated", body


def test_cli_publish_needs_a_token_with_the_publish_scope(secured, tmp_path: Path) -> None:
    source = tmp_path / "tools" / "hello"
    shutil.copytree(EXAMPLES / "hello", source)
    manifest = source / "tool.yaml"
    manifest.write_text(manifest.read_text().replace("tool_id: hello", "tool_id: greeter"))
    code, body = _cli(secured, "publish", str(source))
    assert code == 1 and body["error"]["code"] == "E3203"
    code, body = _cli(secured, "publish", str(source), "--token",
                      _token(secured, "did:example:x", publish=["hello"]))
    assert code == 1 and body["error"]["code"] == "E3206"
    code, body = _cli(secured, "publish", str(source), "--token",
                      _token(secured, "did:example:x", publish=["greet*"]))
    assert code == 0 and body[0]["type"] == "tool.published", body
    assert body[0]["published_by"] == "did:example:x"
    assert body[0]["executor_pin"]["tool_id"] == "python_runtime"


def test_cli_policy_apply_needs_a_token_with_the_policy_scope(secured, tmp_path: Path) -> None:
    policy = tmp_path / "permit_all.cedar"
    policy.write_text(PERMIT_ALL)
    code, body = _cli(secured, "policy", "apply", str(policy))
    assert code == 1 and body["error"]["code"] == "E3203"
    code, body = _cli(secured, "policy", "apply", str(policy),
                      "--token", _token(secured, "did:example:x", audit=True))
    assert code == 1 and body["error"]["code"] == "E3206"
    code, body = _cli(secured, "policy", "apply", str(policy),
                      "--token", _token(secured, "did:example:x", policy=True))
    assert code == 0 and body["type"] == "policy.updated"


# --- reads -----------------------------------------------------------------------------


def test_a_caller_reads_only_its_own_invocations(secured, adas_invocation) -> None:
    url = f"/v1/invocations/{adas_invocation}"
    assert secured.http.get(url).status_code == 401
    bob = bearer(_token(secured, "did:example:bob"))
    stranger = secured.http.get(url, headers=bob)
    assert stranger.status_code == 403 and "ada's secret" not in stranger.text
    ada = bearer(_token(secured, "did:example:ada"))
    assert secured.http.get(url, headers=ada).json()["result"] == {"echo": "ada's secret",
                                                                   "keys": 1}
    auditor = bearer(_token(secured, "did:example:auditor", audit=True))
    assert secured.http.get(url, headers=auditor).status_code == 200
    listed = {v["invocation_id"] for v in secured.http.get(
        "/v1/invocations", headers=bob).json()["invocations"]}
    assert adas_invocation not in listed
    listed = {v["invocation_id"] for v in secured.http.get(
        "/v1/invocations", headers=ada).json()["invocations"]}
    assert adas_invocation in listed


def test_the_audit_trail_needs_a_token_and_shows_a_caller_its_own(secured,
                                                                   adas_invocation) -> None:
    assert secured.http.get("/v1/audit").status_code == 401
    bob = secured.http.get("/v1/audit", params={"limit": 1000},
                           headers=bearer(_token(secured, "did:example:bob"))).json()
    assert "ada's secret" not in json.dumps(bob)
    ada = secured.http.get("/v1/audit", params={"limit": 1000},
                           headers=bearer(_token(secured, "did:example:ada"))).json()
    assert {r["invocation_id"] for r in ada["records"]} == {adas_invocation}
    auditor = secured.http.get("/v1/audit", params={"limit": 1000}, headers=bearer(
        _token(secured, "did:example:auditor", audit=True))).json()
    assert adas_invocation in {r["invocation_id"] for r in auditor["records"]}
    assert "tool.published" in {r["type"] for r in auditor["records"]}


def test_the_status_page_needs_a_token(secured, adas_invocation) -> None:
    anonymous = secured.http.get("/")
    assert anonymous.status_code == 401 and adas_invocation not in anonymous.text
    assert 'action="/session"' in anonymous.text
    bob = secured.http.get("/", headers=bearer(_token(secured, "did:example:bob")))
    assert bob.status_code == 200 and adas_invocation not in bob.text
    auditor = _token(secured, "did:example:auditor", audit=True)
    signed_in = secured.http.post("/session", data={"token": auditor})
    assert signed_in.status_code == 303
    cookie = signed_in.cookies.get("toolexec_token")
    assert cookie == auditor and "httponly" in signed_in.headers["set-cookie"].lower()
    with httpx.Client(base_url=secured.url, cookies={"toolexec_token": cookie},
                      timeout=WAIT) as browser:
        page = browser.get("/")
        assert page.status_code == 200 and adas_invocation in page.text
        # The session cookie reads; it never writes.
        write = browser.post("/v1/tools/register", json={"manifest": {}, "files": []})
        assert write.status_code == 401


def test_the_live_status_and_invocation_pages_read_like_the_api(secured,
                                                               adas_invocation) -> None:
    page_of_ada = f"/invocations/{adas_invocation}"
    with httpx.Client(base_url=secured.url, timeout=WAIT) as nobody:  # no session cookie
        assert nobody.get("/status.json").status_code == 401
        anonymous = nobody.get(page_of_ada)
        assert anonymous.status_code == 401 and "ada's secret" not in anonymous.text

    bob = bearer(_token(secured, "did:example:bob"))
    bobs_status = secured.http.get("/status.json", headers=bob)
    assert bobs_status.status_code == 200
    assert adas_invocation not in bobs_status.text and "ada's secret" not in bobs_status.text
    refused = secured.http.get(page_of_ada, headers=bob)
    assert refused.status_code == 403 and "E3206" in refused.text
    assert "ada's secret" not in refused.text

    ada = bearer(_token(secured, "did:example:ada"))
    adas_status = secured.http.get("/status.json", headers=ada).json()
    assert adas_invocation in {v["invocation_id"] for v in adas_status["invocations"]}
    own = secured.http.get(page_of_ada, headers=ada)
    assert own.status_code == 200 and "ada&#x27;s secret" in own.text
    assert "tool.invoke.completed" in own.text

    auditor = _token(secured, "did:example:auditor", audit=True)
    with httpx.Client(base_url=secured.url, cookies={"toolexec_token": auditor},
                      timeout=WAIT) as browser:
        assert browser.get(page_of_ada).status_code == 200
        everyone = browser.get("/status.json").json()
        assert adas_invocation in {v["invocation_id"] for v in everyone["invocations"]}
        assert everyone["traffic"]["tools"]["py_echo"]


# --- token lifetime --------------------------------------------------------------------


def test_a_token_living_for_ever_is_refused(secured) -> None:
    forever = sign(secured.cwd, sub="did:example:ada", tools=[("py_echo", "^1")], exp=1e30)
    answer = secured.invoke("py_echo", SECRET, headers=bearer(forever))
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "E3203"
    reading = secured.http.get("/v1/invocations", headers=bearer(forever))
    assert reading.status_code == 401


def test_a_token_issued_in_the_future_is_refused(secured) -> None:
    later = int(time.time()) + 3600
    future = sign(secured.cwd, sub="did:example:ada", tools=[("py_echo", "^1")],
                  iat=later, exp=later + 300)
    answer = secured.invoke("py_echo", SECRET, headers=bearer(future))
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "E3203"
    admin = sign(secured.cwd, sub="did:example:ops", scopes={"admin": True},
                 iat=later, exp=later + 300)
    refused = secured.http.post("/v1/tools/sh_upper/lifecycle", headers=bearer(admin),
                                json={"version": "1.0.0", "state": "removed"})
    assert refused.status_code == 401
