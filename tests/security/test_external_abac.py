"""An external ABAC engine decides instead of Cedar (spec 11.3.3): a real HTTP server
plays the engine; unreachable or nonsensical engines fail closed with E3205."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from consumers.adapters.abac_client import HttpAbac
from tests.security.conftest import build_secure_harness, rs256

pytestmark = pytest.mark.security


@dataclass
class Engine:
    """Answers per resource; records every request body it received."""

    answers: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.requests.append({"path": self.path, **body})
                answer = engine.answers.get(body["resource"], {"decision": "allow",
                                                               "reason": "default"})
                raw = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                return None
        return Handler


@pytest.fixture
def engine() -> Iterator[tuple[Engine, str]]:
    state = Engine()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), state.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def _invoke(rsa_key, url: str, params: dict[str, Any] | None = None, *, times: int = 1):
    abac = HttpAbac(url, timeout_seconds=2)
    harness, _, _ = build_secure_harness([rsa_key.public_key()], external=abac)
    ids = [await harness.request("py_echo", params or {"text": "hi"}, token=rs256(rsa_key))
           for _ in range(times)]
    await abac.aclose()
    return harness, ids


async def test_the_engine_allows_and_sees_attributes_but_no_parameter_values(
        rsa_key, engine) -> None:
    state, url = engine
    harness, (invocation,) = await _invoke(rsa_key, url, {"text": "secret-value"})
    assert harness.terminal(invocation).type == "tool.invoke.completed"
    (sent,) = state.requests
    assert sent["path"] == "/v1/authorize" and sent["action"] == "tool.invoke"
    assert sent["subject"] == "did:example:agent"
    assert sent["resource"].startswith("tool:py_echo:1.")
    assert sent["context"]["parameter_keys"] == ["text"]
    assert "secret-value" not in json.dumps(sent)
    decided = harness.of(invocation, "tool.permission.decided")[0].data
    assert decided.policy_version == "external" and "default" in decided.reason


async def test_a_deny_is_E3206_with_the_engine_reason(rsa_key, engine) -> None:
    state, url = engine
    state.answers = {"tool:py_echo:1.0.0": {"decision": "deny", "reason": "outside hours"}}
    harness, (invocation,) = await _invoke(rsa_key, url)
    failed = harness.terminal(invocation).data
    assert failed.error.code == "E3206" and "outside hours" in failed.error.message
    assert harness.runner.plans == []


async def test_decisions_are_cached_per_subject_tool_and_version(rsa_key, engine) -> None:
    state, url = engine
    harness, ids = await _invoke(rsa_key, url, times=3)
    assert [harness.terminal(i).type for i in ids] == ["tool.invoke.completed"] * 3
    assert len(state.requests) == 1


@pytest.mark.parametrize("answer", [b"not json", {"decision": "maybe"}, ["allow"]])
async def test_a_nonsensical_answer_fails_closed_with_E3205(rsa_key, engine, answer) -> None:
    state, url = engine
    state.answers = {"tool:py_echo:1.0.0": answer}
    harness, (invocation,) = await _invoke(rsa_key, url)
    assert harness.terminal(invocation).data.error.code == "E3205"
    assert harness.runner.plans == []


async def test_an_unreachable_engine_fails_closed_with_E3205(rsa_key) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends: nothing listens
    harness, (invocation,) = await _invoke(rsa_key, f"http://127.0.0.1:{port}")
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3205", "authorize")
    assert harness.runner.plans == []
