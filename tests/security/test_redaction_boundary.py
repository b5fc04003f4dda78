"""What leaves a run, seen from both sides of a running `toolexec up`: the caller gets
the tool's result unchanged except for secrets; the audit trail (GET /v1/audit) holds
no secret parameter (by name or by schema mark), no token, and PII only redacted; a
tool's non-JSON stdout fails unless its manifest declares text output; and the state
files others could read are private."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gateway_support import RunningGateway, running_gateway

pytestmark = [pytest.mark.security, pytest.mark.integration]

SECURITY_TOOLS = Path(__file__).parent / "tools" / "redaction"
PASSWORD = "hunter2-correct-horse"
DSN = "postgres://svc:pw-9f3k@db.internal/prod"
JWT = ("eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJkaWQ6ZXhhbXBsZTphZGEifQ."
       "c2lnbmF0dXJlLWJ5dGVz")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("redaction-gateway"),
                         "--tools", str(SECURITY_TOOLS)) as running:
        yield running


@pytest.fixture(scope="module")
def echoed(gateway: RunningGateway) -> dict[str, Any]:
    response = gateway.invoke("pii_echo", {"password": PASSWORD, "dsn": DSN, "auth": [JWT]})
    assert response.status_code == 200, response.text
    return response.json()


def audit_text(gateway: RunningGateway, invocation_id: str) -> str:
    response = gateway.http.get("/v1/audit", params={"invocation": invocation_id,
                                                     "limit": 1000})
    assert response.status_code == 200, response.text
    records = response.json()["records"]
    assert {r["type"] for r in records} >= {"tool.invoke.requested",
                                            "tool.execution.finished",
                                            "tool.invoke.completed"}
    return json.dumps(records)


def test_the_caller_gets_values_that_only_look_like_pii_unchanged(
        echoed: dict[str, Any]) -> None:
    result = echoed["result"]
    assert (result["size"], result["host"], result["zeros"]) == (
        "1073741824", "127.0.0.1", "0000000000000000")
    assert result["contact"] == "ada@example.com"
    assert result["card"] == "4111 1111 1111 1111"


def test_the_caller_gets_no_secret_parameter_back(echoed: dict[str, Any]) -> None:
    said = echoed["result"]["said"]
    assert PASSWORD not in said and DSN not in said and "[REDACTED]" in said


def test_the_audit_trail_holds_no_secret_parameter_nor_token(
        gateway: RunningGateway, echoed: dict[str, Any]) -> None:
    text = audit_text(gateway, echoed["invocation_id"])
    assert PASSWORD not in text  # by name, in the request and in stdout/stderr
    assert DSN not in text  # writeOnly in the schema: scrubbed from every output
    assert JWT not in text  # inside a list
    assert "[JWT_REDACTED]" in text


def test_the_audit_trail_redacts_real_pii(gateway: RunningGateway,
                                          echoed: dict[str, Any]) -> None:
    text = audit_text(gateway, echoed["invocation_id"])
    assert "ada@example.com" not in text and "4111 1111 1111 1111" not in text
    assert "127.0.0.1" not in text
    assert "1073741824" in text and "0000000000000000" in text  # not PII at all


def test_the_audit_hash_chain_still_verifies(gateway: RunningGateway,
                                             echoed: dict[str, Any]) -> None:
    from tests.cli_process import toolexec
    done = toolexec("audit", "verify", "--json", cwd=gateway.cwd, env=gateway.env)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_signed_export_verifies_offline_and_holds_no_secret(
        gateway: RunningGateway, echoed: dict[str, Any], tmp_path: Path) -> None:
    from tests.cli_process import toolexec
    key = toolexec("audit", "public-key", cwd=gateway.cwd, env=gateway.env)
    assert key.returncode == 0, key.stderr
    (tmp_path / "pipeline.pem").write_text(key.stdout)
    export = tmp_path / "trail.jsonl"
    done = toolexec("audit", "export", "--signed", "--output", str(export), cwd=gateway.cwd,
                    env=gateway.env)
    assert done.returncode == 0, done.stderr
    text = export.read_text()
    assert echoed["invocation_id"] in text
    for secret in (PASSWORD, DSN, JWT):
        assert secret not in text
    checked = toolexec("audit", "verify-export", str(export), "--public-key",
                       str(tmp_path / "pipeline.pem"), "--json", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["signature_checked"]


def test_declared_text_output_is_the_result(gateway: RunningGateway) -> None:
    response = gateway.invoke("text_out")
    assert response.status_code == 200, response.text
    assert response.json()["result"] == "plain text, not JSON"


def test_undeclared_non_json_output_fails(gateway: RunningGateway) -> None:
    response = gateway.invoke("text_undeclared")
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "E3303" and "format: text" in error["message"]


def test_state_files_are_private(gateway: RunningGateway, echoed: dict[str, Any]) -> None:
    state = gateway.cwd / ".toolexec"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    expected = ["toolexec.db", "claims.sqlite3", "runtime.json", "keys/private.pem"]
    for name in expected:
        path = state / name
        assert path.exists(), name
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (name, oct(path.stat().st_mode))
    for path in [*state.glob("*.db-wal"), *state.glob("*.db-shm"),
                 *state.glob("claims.sqlite3-*"), *(state / "logs").glob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
