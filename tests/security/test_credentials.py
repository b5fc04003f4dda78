"""Credentials (spec 12.6.2): a `credentials:NAME` secret reaches the tool's
environment only, and never an event, a log line or the terminal error, even when
the tool prints it."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from consumers.primitives.file_store import ContentStore
from consumers.primitives.runner import Primitives
from domain.credentials import CredentialGrants
from domain.integrity import seal
from tests.security.conftest import build_secure_harness, rs256
from toolexec.sources import load_source

pytestmark = pytest.mark.security

SECRET = "sk-live-7f3a9c2e1b4d"
TOOL = Path(__file__).parent / "tools" / "cred_echo"


async def test_credential_reaches_the_tool_but_no_event_or_log(rsa_key, tmp_path: Path) -> None:
    runner = Primitives(ContentStore(tmp_path / "cas"), tmp_path / "work", sandbox="rlimits")
    harness, _, _ = build_secure_harness(
        [rsa_key.public_key()], runner=runner,
        secrets={"CRED_ECHO_TOKEN": SECRET}.get,
        credential_grants=CredentialGrants({"CRED_ECHO_TOKEN": ("cred_echo",)}))
    harness.registry.add(seal(load_source(TOOL)))
    with structlog.testing.capture_logs() as logs:
        invocation = await harness.request(
            "cred_echo", {"password": "hunter2-param"},
            token=rs256(rsa_key, tool="cred_echo"))
    await runner.aclose()
    terminal = harness.terminal(invocation)
    assert terminal.type == "tool.invoke.completed", terminal.data
    result = terminal.data.result
    assert result["has_token"] is True and result["length"] == len(SECRET)
    finished = harness.of(invocation, "tool.execution.finished")[0].data
    assert "leaking" in finished.stderr_tail
    for event in harness.events:
        assert SECRET not in event.data.model_dump_json(), event.type
    assert SECRET not in repr(logs)


async def test_undeclared_credential_is_refused_before_anything_runs(rsa_key) -> None:
    from domain.model import ToolSource

    source = load_source(TOOL)
    manifest = {**source.manifest, "version": "1.1.0", "required_permissions": []}
    harness, _, _ = build_secure_harness(
        [rsa_key.public_key()], secrets={"CRED_ECHO_TOKEN": SECRET}.get)
    harness.registry.add(seal(ToolSource(manifest=manifest, files=source.files, origin="test")))
    invocation = await harness.request("cred_echo", {"password": "x"}, version_range="1.1.0",
                                       token=rs256(rsa_key, tool="cred_echo"))
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3206", "execute")
    assert "CRED_ECHO_TOKEN" in failed.error.message
    assert harness.runner.plans == []
    for event in harness.events:
        assert SECRET not in event.data.model_dump_json(), event.type
