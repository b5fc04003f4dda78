"""Publisher signatures through a running `toolexec up` with a trust store that
requires them for `signed_*` tools: an unsigned version is refused at resolution
(E3107, a failed invocation), one signed by the trusted key runs, one signed by
another key is refused, and a record whose contents were changed under the
publisher's signature is refused; `show` says who signed."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from contracts.events import PublisherSignature as SignatureContract
from domain.integrity import file_sha256
from domain.model import ToolFile, ToolSource
from domain.publisher_signature import sign_integrity
from tests.cli_process import toolexec
from tests.integration.gateway_support import (
    TEST_TOOLS,
    RunningGateway,
    running_gateway,
    wait_until,
)
from toolexec.client import InvocationClient
from toolexec.keys import load_publisher_private_key
from toolexec.publishing import publish_event

pytestmark = pytest.mark.integration

ECHO_MAIN = (TEST_TOOLS / "py_echo" / "main.py").read_text()
ECHO = {"text": "hi"}


def manifest(tool_id: str, version: str = "1.0.0") -> dict[str, Any]:
    return {"tool_id": tool_id, "version": version, "tool_type": "script",
            "executor": "python_runtime", "config": {"entrypoint": "main.py"},
            "description": "Echo for publisher signature tests.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                           "required": ["text"]}}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two publisher key pairs made by `toolexec keys new`: `trusted` and `rogue`."""
    where = tmp_path_factory.mktemp("publisher-keys")
    made = {}
    for name in ("trusted", "rogue"):
        done = toolexec("keys", "new", str(where / f"{name}.pem"), "--json", cwd=where)
        assert done.returncode == 0, done.stderr
        made[name] = json.loads(done.stdout)
    assert (where / "trusted.pem").stat().st_mode & 0o777 == 0o600
    return made


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory,
           keys: dict[str, Any]) -> Iterator[RunningGateway]:
    env = {"TOOLEXEC_TRUSTED_PUBLISHERS": json.dumps(
               {"signed_": [keys["trusted"]["public_key"]]}),
           "TOOLEXEC_REQUIRE_SIGNATURES": "true"}
    with running_gateway(tmp_path_factory.mktemp("signatures"), env=env) as running:
        yield running


def cli(system: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return toolexec(*args, cwd=system.cwd, env=system.env)


def write_tool(directory: Path, tool_id: str, main: str = ECHO_MAIN) -> Path:
    directory.mkdir(parents=True)
    (directory / "tool.yaml").write_text(json.dumps(manifest(tool_id)))
    (directory / "main.py").write_text(main)
    return directory


def refused(response: Any, verdict: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "E3107", error
    assert error["details"]["verdict"] == verdict


def failed_invocations(system: RunningGateway, tool_id: str) -> list[dict[str, Any]]:
    """The audit's `tool.invoke.failed` records of `tool_id`, once it holds some."""
    def records() -> list[dict[str, Any]]:
        answer = system.http.get("/v1/audit", params={"tool": tool_id,
                                                      "type": "tool.invoke.failed"})
        assert answer.status_code == 200, answer.text
        return answer.json()["records"]

    return wait_until(records)


def test_an_unsigned_version_is_refused_under_the_trust_store(system) -> None:
    response = system.register(manifest("signed_unsigned"),
                               [{"path": "main.py", "content": ECHO_MAIN}])
    assert response.status_code == 201, response.text
    refused(system.invoke("signed_unsigned", ECHO), "unsigned")
    # tools no prefix covers still run unsigned
    assert system.invoke("py_echo", ECHO).status_code == 200


def test_a_version_signed_by_the_trusted_key_runs_and_show_names_the_signer(
        system, keys, tmp_path: Path) -> None:
    tool = write_tool(tmp_path / "signed_good", "signed_good")
    done = cli(system, "publish", str(tool), "--sign-key", keys["trusted"]["private_key"],
               "--json")
    assert done.returncode == 0, done.stderr
    [published] = json.loads(done.stdout)
    assert published["type"] == "tool.published"
    assert published["publisher_signature"]["key_id"] == keys["trusted"]["key_id"]

    response = system.invoke("signed_good", ECHO)
    assert response.status_code == 200, response.text
    assert response.json()["result"] == {"echo": "hi", "keys": 1}

    shown = cli(system, "show", "signed_good", "--json")
    assert shown.returncode == 0, shown.stderr
    [version] = json.loads(shown.stdout)["tool"]["versions"]
    assert version["publisher"] == {"key_id": keys["trusted"]["key_id"], "verdict": "trusted"}
    detail = system.http.get("/v1/tools/signed_good").json()["tool"]["versions"][0]
    assert detail["publisher"] == version["publisher"]


def test_a_client_side_signature_by_an_untrusted_key_is_refused(
        system, keys, tmp_path: Path) -> None:
    tool = write_tool(tmp_path / "signed_rogue", "signed_rogue")
    done = cli(system, "integrity", str(tool), "--sign-key", keys["rogue"]["private_key"],
               "--json")
    assert done.returncode == 0, done.stderr
    signature = json.loads(done.stdout)["publisher_signature"]
    response = system.http.post("/v1/tools/register", json={
        "manifest": manifest("signed_rogue"), "files": [{"path": "main.py", "content": ECHO_MAIN}],
        "publisher_signature": signature})
    assert response.status_code == 201, response.text

    refused(system.invoke("signed_rogue", ECHO), "untrusted_key")
    [failure] = failed_invocations(system, "signed_rogue")
    assert "E3107" in json.dumps(failure)
    shown = json.loads(cli(system, "show", "signed_rogue", "--json").stdout)
    assert shown["tool"]["versions"][0]["publisher"]["verdict"] == "untrusted_key"


def test_the_gateway_refuses_a_signature_made_for_other_contents(system, keys) -> None:
    key = load_publisher_private_key(Path(keys["trusted"]["private_key"]))
    other = sign_integrity(key, "sha256:" + "0" * 64)
    response = system.http.post("/v1/tools/register", json={
        "manifest": manifest("signed_mismatch"),
        "files": [{"path": "main.py", "content": ECHO_MAIN}],
        "publisher_signature": {"key_id": other.key_id, "signature": other.signature}})
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "E3107"
    assert system.http.get("/v1/tools/signed_mismatch").status_code == 404


def test_contents_changed_under_the_publishers_signature_are_refused(system, keys) -> None:
    """Someone with write access to the registry topic re-publishes a signed version
    with other code and its recomputed integrity, keeping the publisher's signature."""
    key = load_publisher_private_key(Path(keys["trusted"]["private_key"]))
    original = ToolSource(manifest("signed_tampered"), (_file(ECHO_MAIN),), origin="test")
    signature = sign_integrity(key, publish_event(
        original, now=datetime.now(UTC)).data.integrity)
    tampered = ToolSource(original.manifest, (_file(ECHO_MAIN + "\n# changed\n"),),
                          origin="test")
    event = publish_event(tampered, now=datetime.now(UTC))
    forged = replace(event, data=event.data.model_copy(update={
        "publisher_signature": SignatureContract(key_id=signature.key_id,
                                                 signature=signature.signature)}))
    bootstrap = json.loads((system.cwd / ".toolexec" / "runtime.json").read_text())[
        "kafka_bootstrap"]

    async def send() -> None:
        async with InvocationClient(bootstrap) as client:
            await client.send(forged)

    asyncio.run(send())
    refused(system.invoke("signed_tampered", ECHO), "invalid")


def _file(content: str) -> ToolFile:
    raw = content.encode()
    return ToolFile(path="main.py", sha256=file_sha256(raw), is_executable=False, content=raw)
