"""Issue 14, door 4: the operator grants credentials; what a tool prints is scrubbed.

Repros of the hole: a tool author declared `credentials:DB_PASSWORD` and received
any environment variable of `up`; scrubbing caught only the exact value, so base64,
reversed and split forms came back in results, `stderr_tail`, the audit and Kafka.
Now a declaration alone grants nothing (TOOLEXEC_CREDENTIAL_GRANTS decides), and
every string leaving a run is scrubbed of the credential's common encodings before
any event exists.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from consumers.primitives.file_store import ContentStore
from consumers.primitives.runner import Primitives
from domain.credentials import CredentialGrants
from domain.integrity import seal
from tests.security.conftest import build_secure_harness, rs256
from toolexec.sources import load_source

pytestmark = pytest.mark.security

SECRET = "db-pass-Q7w9Xz3Lm2Nk8Rt4"
TOOLS = Path(__file__).parent / "tools"


def _forms(secret: str) -> list[str]:
    raw = secret.encode()
    return [secret, base64.b64encode(raw).decode(), base64.b64encode(b"user:" + raw + b"!")
            .decode()[8:-4], raw.hex(), raw.hex().upper(), secret[::-1], secret.upper(),
            secret[:len(secret) // 2], secret[len(secret) // 2:],
            "".join(f"%{b:02x}" for b in raw)]


async def _invoke(rsa_key: Any, tmp_path: Path, tool: str, params: dict[str, Any],
                  grants: CredentialGrants | None = None, **harness_options: Any):
    runner = Primitives(ContentStore(tmp_path / "cas"), tmp_path / "work", sandbox="rlimits")
    options: dict[str, Any] = {"runner": runner, "secrets": {"ENCODER_TOKEN": SECRET}.get}
    if grants is not None:
        options["credential_grants"] = grants
    harness, _, _ = build_secure_harness([rsa_key.public_key()], **options, **harness_options)
    harness.registry.add(seal(load_source(TOOLS / tool)))
    invocation = await harness.request(tool, params, token=rs256(rsa_key, tool=tool))
    await runner.aclose()
    return harness, invocation


async def test_declaring_a_credential_alone_grants_nothing(rsa_key, tmp_path: Path) -> None:
    harness, invocation = await _invoke(rsa_key, tmp_path, "secret_encoder", {})
    failed = harness.terminal(invocation)
    assert failed.type == "tool.invoke.failed", failed.data
    assert (failed.data.error.code, failed.data.stage) == ("E3206", "execute")
    assert "not granted" in failed.data.error.message
    assert harness.of(invocation, "tool.execution.started") == []
    for event in harness.events:
        assert SECRET not in event.data.model_dump_json(), event.type


async def test_a_grant_for_another_tool_grants_nothing(rsa_key, tmp_path: Path) -> None:
    harness, invocation = await _invoke(
        rsa_key, tmp_path, "secret_encoder", {},
        CredentialGrants({"ENCODER_TOKEN": ("secret_encoder_v2", "other.*")}))
    assert harness.terminal(invocation).data.error.code == "E3206"


async def test_a_granted_secret_never_leaves_in_any_common_encoding(
        rsa_key, tmp_path: Path) -> None:
    harness, invocation = await _invoke(rsa_key, tmp_path, "secret_encoder", {},
                                        CredentialGrants({"ENCODER_TOKEN": ("secret_*",)}))
    completed = harness.terminal(invocation)
    assert completed.type == "tool.invoke.completed", completed.data
    assert completed.data.result["length"] == len(SECRET)  # the tool did get it
    finished = harness.of(invocation, "tool.execution.finished")[0].data
    assert "plain=[REDACTED]" in finished.stderr_tail
    _assert_nowhere(harness.events, _forms(SECRET))


async def test_a_failing_tool_leaks_nothing_through_its_error(rsa_key, tmp_path: Path) -> None:
    harness, invocation = await _invoke(rsa_key, tmp_path, "secret_encoder", {"fail": True},
                                        CredentialGrants({"ENCODER_TOKEN": ("secret_encoder",)}))
    failed = harness.terminal(invocation)
    assert failed.type == "tool.invoke.failed" and failed.data.error.code == "E3401"
    assert "hex=[REDACTED]" in json.dumps(failed.data.error.details)
    _assert_nowhere(harness.events, _forms(SECRET))


def _assert_nowhere(events: list[Any], forms: list[str]) -> None:
    for event in events:
        text = event.data.model_dump_json()
        for form in forms:
            assert form not in text and form.lower() not in text.lower(), (event.type, form)
