"""The HTTP gateway of `toolexec up`, used over HTTP as clients do: real broker, real
read models (SQLite), real tool processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts import topics
from tests.integration.gateway_support import (
    RunningGateway,
    free_port,
    interrupt,
    refused_api_tool,
    running_gateway,
    wait_until,
)

pytestmark = pytest.mark.integration

STATUSES = {"requested", "resolved", "authorized", "running", "completed", "failed", "cancelled"}
NAPPER = {
    "tool_id": "napper", "version": "1.0.0", "tool_type": "script",
    "executor": "python_runtime", "description": "Sleeps a moment, then answers.",
    "config": {"entrypoint": "main.py"}, "timeout_default": 20,
    "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}},
                   "required": ["seconds"]},
}
NAPPER_MAIN = ("import json, sys, time\nparams = json.load(sys.stdin)\n"
               "time.sleep(params['seconds'])\nprint(json.dumps({'slept': params['seconds']}))\n")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("gateway")) as running:
        yield running


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and {"code", "message", "details"} <= set(body["error"])
    return body["error"]


def test_up_writes_the_gateway_url_and_serves_the_openapi_document(gateway) -> None:
    runtime = json.loads((gateway.cwd / ".toolexec" / "runtime.json").read_text())
    assert runtime["gateway_url"] == gateway.url and gateway.url.startswith("http://127.0.0.1:")
    assert gateway.http.get("/docs").status_code == 200
    paths = gateway.http.get("/openapi.json").json()["paths"]
    assert {"/v1/tools/invoke", "/v1/invocations/{invocation_id}", "/v1/tools/register",
            "/v1/tools", "/v1/tools/{tool_id}", "/v1/audit", "/v1/circuits", "/health",
            "/metrics"} <= set(paths)


def test_sync_invoke_answers_with_the_result(gateway) -> None:
    response = gateway.invoke("py_echo", {"text": "hi", "times": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed" and body["result"] == {"echo": "hihi", "keys": 2}
    assert body["tool_id"] == "py_echo" and body["version"] == "1.0.0"

    view = gateway.http.get(f"/v1/invocations/{body['invocation_id']}").json()
    assert view["status"] == "completed" and view["result"] == {"echo": "hihi", "keys": 2}
    assert [e["type"] for e in view["timeline"]][0] == "tool.invoke.requested"
    assert view["timeline"][-1]["type"] == "tool.invoke.completed"


def test_async_invoke_answers_202_and_polling_reaches_completed(gateway) -> None:
    registered = gateway.register(NAPPER, [{"path": "main.py", "content": NAPPER_MAIN}])
    assert registered.status_code == 201, registered.text

    response = gateway.invoke("napper", {"seconds": 1}, execution_mode="async")
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["status"] == "requested"
    assert response.headers["location"] == accepted["status_url"]

    seen: list[str] = []

    def finished() -> dict | None:
        view = gateway.http.get(accepted["status_url"])
        if view.status_code == 404:  # not folded into the read model yet
            return None
        seen.append(view.json()["status"])
        return view.json() if view.json()["status"] in ("completed", "failed") else None

    final = wait_until(finished)
    assert final["status"] == "completed", final
    assert final["result"] == {"slept": 1}
    assert set(seen) <= STATUSES


def test_unknown_tool_is_404_with_E3101(gateway) -> None:
    response = gateway.invoke("no_such_tool")
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "E3101" and error["details"]["stage"] == "resolve"


def test_parameters_that_violate_the_tool_schema_are_400_with_E3301(gateway) -> None:
    response = gateway.invoke("py_echo", {"text": 42})
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "E3301"
    assert error["details"]["issues"][0]["path"] == "$.text"


def test_a_malformed_request_body_is_422_with_E3004(gateway) -> None:
    response = gateway.http.post("/v1/tools/invoke", json={"parameters": "not an object"})
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "E3004"
    assert {tuple(e["loc"]) for e in error["details"]["errors"]} >= {
        ("body", "tool_id"), ("body", "parameters")}


def test_an_unknown_invocation_is_404_with_E3702(gateway) -> None:
    response = gateway.http.get("/v1/invocations/does-not-exist")
    assert response.status_code == 404 and error_of(response)["code"] == "E3702"


def test_register_publishes_a_tool_listed_and_shown_by_the_registry(gateway) -> None:
    manifest = {**NAPPER, "tool_id": "napper_two", "description": "A second napper, for search."}
    response = gateway.register(manifest, [{"path": "main.py", "content": NAPPER_MAIN}])
    assert response.status_code == 201, response.text
    published = response.json()
    assert published["integrity"].startswith("sha256:")

    listed = gateway.http.get("/v1/tools", params={"q": "second napper"}).json()["tools"]
    assert [t["tool_id"] for t in listed][:2] == ["napper_two", "napper"]  # ranked: both words first
    shown = gateway.http.get("/v1/tools/napper_two").json()["tool"]
    assert shown["versions"][0]["integrity"] == published["integrity"]
    assert shown["versions"][0]["files"][0]["path"] == "main.py"

    ran = gateway.invoke("napper_two", {"seconds": 0})
    assert ran.status_code == 200 and ran.json()["result"] == {"slept": 0}


def test_register_rejects_an_invalid_manifest_with_422_E3105(gateway) -> None:
    response = gateway.register({"tool_id": "Bad-Name", "version": "one", "tool_type": "script"})
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "E3105" and error["details"]["issues"]


def test_register_refuses_paths_outside_the_tool(gateway) -> None:
    response = gateway.register({**NAPPER, "tool_id": "escaper"},
                                [{"path": "../main.py", "content": NAPPER_MAIN}])
    assert response.status_code == 422 and error_of(response)["code"] == "E3105"


def test_unknown_tool_detail_is_404(gateway) -> None:
    response = gateway.http.get("/v1/tools/no_such_tool")
    assert response.status_code == 404 and error_of(response)["code"] == "E3101"


def test_audit_replays_one_invocation_in_order_without_its_token(gateway) -> None:
    iid = gateway.invoke("py_echo", {"text": "audited"},
                         headers={"Authorization": "Bearer not.a.token"}).json()["invocation_id"]

    # Read-your-writes: asked right after the sync reply, no polling.
    found = gateway.http.get("/v1/audit", params={"invocation": iid}).json()["records"]
    types = [r["type"] for r in found]
    assert types[0] == "tool.invoke.requested" and types[-1] == "tool.invoke.completed"
    assert all(r["invocation_id"] == iid for r in found)
    assert "not.a.token" not in json.dumps(found)

    only = gateway.http.get("/v1/audit", params={"invocation": iid,
                                                 "type": "tool.invoke.completed"}).json()
    assert only["count"] == 1 and only["records"][0]["event"]["data"]["result"]["echo"] == "audited"
    bad = gateway.http.get("/v1/audit", params={"since": "2026-01-01T00:00:00"})
    assert bad.status_code == 422 and error_of(bad)["code"] == "E3004"


def test_a_failing_external_service_opens_its_circuit(gateway) -> None:
    tool = refused_api_tool("refused_api", "refused-service")
    assert gateway.register(tool).status_code == 201
    first = gateway.invoke("refused_api")
    assert first.status_code == 503 and error_of(first)["code"] == "E3502"

    def open_circuit() -> dict | None:
        circuits = gateway.http.get("/v1/circuits").json()["circuits"]
        return next((c for c in circuits if c["service_id"] == "refused-service"
                     and c["state"] == "open"), None)

    wait_until(open_circuit)
    refused = wait_until(lambda: (r := gateway.invoke("refused_api")).status_code == 503
                         and error_of(r)["code"] == "E3501" and r)
    assert error_of(refused)["details"]["invocation_id"]
    opened = gateway.http.get("/v1/circuits", params={"open_only": True}).json()["circuits"]
    assert "refused-service" in {c["service_id"] for c in opened}


def test_health_reports_broker_database_and_consumers(gateway) -> None:
    response = gateway.http.get("/health")
    assert response.status_code == 200, response.text
    health = response.json()
    assert health["status"] == "ok"
    assert health["checks"]["broker"]["ok"] and health["checks"]["database"]["ok"]
    consumers = health["checks"]["consumers"]["consumers"]
    assert {"toolexec.pipeline", "toolexec.circuits", "projection.invocations",
            "projection.audit"} <= set(consumers)
    assert set(consumers.values()) == {"running"}


def test_metrics_count_invocations_and_expose_latency_lag_and_breakers(gateway) -> None:
    assert gateway.invoke("py_echo", {"text": "metered"}).status_code == 200
    assert gateway.invoke("no_such_tool").status_code == 404
    assert gateway.register(refused_api_tool("refused_metrics", "metrics-service")).is_success
    assert gateway.invoke("refused_metrics").status_code == 503
    wait_until(lambda: any(c["service_id"] == "metrics-service" and c["state"] == "open"
                           for c in gateway.http.get("/v1/circuits").json()["circuits"]))
    text = gateway.http.get("/metrics").text

    def value(line_start: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.startswith(line_start))
        return float(line.rsplit(" ", 1)[1])

    assert value('toolexec_invocations_total{code="",outcome="completed",tool_id="py_echo"}') >= 1
    assert value('toolexec_invocations_started_total{tool_id="py_echo"}') >= 1
    assert value('toolexec_invocations_total{code="E3101",outcome="failed",'
                 'tool_id="no_such_tool"}') >= 1
    for step in ("resolve", "authorize", "execute", "finalize", "total"):
        assert value(f'toolexec_pipeline_step_seconds_count{{step="{step}"}}') >= 1
    assert 'toolexec_consumer_lag{consumer="toolexec.pipeline"}' in text
    assert 'toolexec_consumer_lag{consumer="toolexec.circuits"}' in text
    assert 'toolexec_consumer_lag{consumer="projection.audit"}' in text
    assert value('toolexec_circuit_state{service_id="metrics-service"}') == 2  # open
    assert "toolexec_decision_cache_hits" in text  # the consumers' metrics, same registry


def test_asyncapi_document_lists_every_event_contract(gateway) -> None:
    document = gateway.http.get("/asyncapi.json").json()
    assert document["asyncapi"].startswith("3.")
    channels = document["channels"]
    assert channels["requests"]["address"] == "toolexec.requests"
    assert "InvokeRequested" in channels["requests"]["messages"]
    assert "InvokeCompleted" in channels["invocations"]["messages"]
    assert "InvokeRequested" in document["components"]["schemas"]
    assert len(channels) == len(topics.ALL_TOPICS)  # one per topic


def test_up_serves_on_a_fixed_port_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    port = free_port()
    with running_gateway(tmp_path, "--gateway-port", str(port)) as running:
        assert running.url == f"http://127.0.0.1:{port}"
        assert running.http.get("/health").status_code == 200
        assert interrupt(running.process) == 0
    assert not (tmp_path / ".toolexec" / "runtime.json").exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
