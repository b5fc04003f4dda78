"""Hostile request bodies against a running `toolexec up`: huge bodies (declared or
streamed), oversize parameters, lone surrogates and NaN/Infinity. Each is answered
with an E3004 error body (413 or 422), never accepted, never a 500, never silently
changed; and `toolexec run --params` holds the same line."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.cli_process import toolexec
from tests.integration.gateway_support import RunningGateway, running_gateway

pytestmark = [pytest.mark.security, pytest.mark.integration]

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("limits-gateway")) as running:
        yield running


def raw_post(url: str, path: str, head: dict[str, str], body_chunks: Iterator[bytes],
             ) -> tuple[int, dict[str, object], int]:
    """POST over a plain socket, sending body chunks until the server answers or
    stops reading; (status, JSON body, bytes of body sent)."""
    parts = urlsplit(url)
    sent = 0
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        lines = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}",
                 *(f"{k}: {v}" for k, v in head.items()), "", ""]
        sock.sendall("\r\n".join(lines).encode())
        sock.settimeout(0.05)
        reply = b""
        for chunk in body_chunks:
            with contextlib.suppress(TimeoutError):
                reply += sock.recv(65536)
            if reply:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        sock.settimeout(60)
        while b"\r\n\r\n" not in reply or not _complete(reply):
            data = sock.recv(65536)
            if not data:
                break
            reply += data
    head_text, _, payload = reply.partition(b"\r\n\r\n")
    status = int(head_text.split(b" ", 2)[1])
    return status, json.loads(payload), sent


def _complete(reply: bytes) -> bool:
    head, _, payload = reply.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(payload) >= int(line.split(b":")[1])
    return False


def test_a_declared_200_mb_body_is_refused_before_it_is_read(gateway: RunningGateway) -> None:
    status, body, sent = raw_post(
        gateway.url, "/v1/tools/invoke",
        {"Content-Type": "application/json", "Content-Length": str(200 * MIB)},
        iter([b'{"tool_id": "hello", "parameters": {"x": "'] + [b"a" * 65536] * 3200))
    assert status == 413
    assert body["error"]["code"] == "E3004" and body["error"]["details"]["max"] == MIB
    assert sent < 20 * MIB


def test_a_streamed_body_is_cut_off_at_the_limit(gateway: RunningGateway) -> None:
    def chunked() -> Iterator[bytes]:
        for _ in range(3200):  # 200 MB if nobody stops it
            yield b"10000\r\n" + b"a" * 65536 + b"\r\n"

    status, body, sent = raw_post(gateway.url, "/v1/tools/invoke",
                                  {"Content-Type": "application/json",
                                   "Transfer-Encoding": "chunked"}, chunked())
    assert status == 413 and body["error"]["code"] == "E3004"
    assert sent < 20 * MIB


def test_a_10_mb_parameter_is_413_not_a_broker_error(gateway: RunningGateway) -> None:
    response = gateway.invoke("hello", {"name": "a" * (10 * MIB)})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "E3004"


def test_parameters_past_their_own_limit_are_413(gateway: RunningGateway) -> None:
    response = gateway.invoke("hello", {"name": "a" * (512 * 1024)})
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "E3004" and "parameters" in error["message"]


def test_a_lone_surrogate_is_422_not_an_internal_error(gateway: RunningGateway) -> None:
    body = '{"tool_id": "hello", "parameters": {"name": "\\ud800"}}'
    response = gateway.http.post("/v1/tools/invoke", content=body,
                                 headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "E3004" and error["details"]["reason"] == "lone_surrogate"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_422_not_null(gateway: RunningGateway, constant: str) -> None:
    body = f'{{"tool_id": "hello", "parameters": {{"name": {constant}}}}}'
    response = gateway.http.post("/v1/tools/invoke", content=body,
                                 headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"]["details"]["reason"] == "non_finite_number"


def test_a_paired_surrogate_escape_is_ordinary_text(gateway: RunningGateway) -> None:
    body = '{"tool_id": "hello", "parameters": {"name": "\\ud83d\\ude00"}}'
    response = gateway.http.post("/v1/tools/invoke", content=body,
                                 headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert "\N{GRINNING FACE}" in json.dumps(response.json()["result"], ensure_ascii=False)


def test_register_refuses_nan_in_a_manifest(gateway: RunningGateway) -> None:
    body = '{"manifest": {"tool_id": "nan_tool", "priority": NaN}, "files": []}'
    response = gateway.http.post("/v1/tools/register", content=body,
                                 headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and response.json()["error"]["code"] == "E3004"


def test_run_params_refuses_nan(tmp_path: Path) -> None:
    done = toolexec("run", "hello", "--params", '{"name": NaN}', "--json", cwd=tmp_path)
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["code"] == "E3004"


def test_run_params_refuses_oversize_parameters(tmp_path: Path) -> None:
    done = toolexec("run", "hello", "--params", json.dumps({"name": "a" * 2000}),
                    "--json", cwd=tmp_path, env={"TOOLEXEC_MAX_PARAMETER_BYTES": "1000"})
    assert done.returncode == 2
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "E3004" and error["details"]["reason"] == "too_large"


def test_publishing_thirty_thousand_empty_files_is_e3105(gateway: RunningGateway,
                                                        tmp_path: Path) -> None:
    tool = tmp_path / "many_files"
    (tool / "data").mkdir(parents=True)
    (tool / "tool.yaml").write_text('tool_id: many_files\nversion: "1.0.0"\ntool_type: script\n'
                                    "executor: python_runtime\nconfig: {entrypoint: main.py}\n")
    (tool / "main.py").write_text("print('{}')\n")
    for index in range(30_000):
        (tool / "data" / f"{index}.txt").touch()
    done = toolexec("publish", str(tool), "--json", cwd=gateway.cwd, env=gateway.env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "MessageSizeTooLarge" not in done.stderr
    [event] = json.loads(done.stdout)
    assert event["type"] == "tool.publish.rejected"
    assert event["error"]["code"] == "E3105" and "file limit" in event["error"]["message"]
