"""compose/: Prometheus, Grafana and the toolexec gateway fit together (checked statically,
there is no Docker here), and every dashboard query asks for metrics and labels that
toolexec exports (the prometheus-client registry of the modules `toolexec up` runs)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import toolexec.metrics
import toolexec.stack  # noqa: F401  (registers the pipeline's own metrics)
from tests.waiting import WAIT

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
COMPOSE = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
DASHBOARD_FILES = sorted((COMPOSE_DIR / "grafana" / "dashboards").glob("*.json"))
PROMETHEUS = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
DATASOURCES = yaml.safe_load(
    (COMPOSE_DIR / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
PROVIDERS = yaml.safe_load(
    (COMPOSE_DIR / "grafana" / "provisioning" / "dashboards" / "toolexec.yml").read_text())

SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"), "info": ("_info",),
            "stateset": ("",), "enum": ("",), "unknown": ("",)}


def exported() -> dict[str, set[str]]:
    """Sample name -> its label names, for every series the registry can export."""
    names: dict[str, set[str]] = {}
    for family in REGISTRY.collect():
        for suffix in SUFFIXES[family.type]:
            name = family.name + suffix
            collector = REGISTRY._names_to_collectors.get(name)
            labels = set(getattr(collector, "_labelnames", ()))
            names[name] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "offset", "and", "or", "unless", "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metrics_of(expr: str) -> tuple[set[str], dict[str, set[str]], set[str]]:
    """(metric names, metric -> label names it is filtered on, grouping labels) of a
    PromQL expression; Grafana variables such as `$__rate_interval` are ignored."""
    expr = re.sub(r"\$\w+", "1m", expr)
    matchers: dict[str, set[str]] = {}
    for name, body in _SELECTOR.findall(expr):
        labels = {m.split("=")[0].rstrip("!~").strip() for m in
                  _STRING.sub('""', body).split(",") if m.strip()}
        matchers.setdefault(name, set()).update(labels)
    grouping = {label.strip() for group in _GROUPING.findall(expr)
                for label in group.split(",") if label.strip()}
    bare = _GROUPING.sub(" ", _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ",
                                            _STRING.sub('""', expr)))
    bare = re.sub(r"\[[^\]]*\]", " ", bare)
    names = {m.group(0) for m in _IDENT.finditer(bare)
             if m.group(0).lower() not in PROMQL_WORDS
             and not bare[m.end():].lstrip().startswith("(")
             and not re.match(r"\d", m.group(0))}
    return names, matchers, grouping


def queries(dashboard: dict) -> list[str]:
    exprs = [target["expr"] for panel in dashboard["panels"]
             for target in panel.get("targets", [])]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text or "")
        if found:  # Grafana's function around a selector: check the selector and label
            exprs.append(f"sum by ({found.group(2)}) ({found.group(1)})")
    return exprs


@pytest.fixture(params=DASHBOARD_FILES, ids=lambda p: p.name)
def dashboard(request) -> dict:
    return json.loads(request.param.read_text())


def test_there_is_a_dashboard() -> None:
    assert [p.name for p in DASHBOARD_FILES] == ["toolexec.json"]


def test_every_query_names_metrics_and_labels_toolexec_exports(dashboard: dict) -> None:
    series = exported()
    exprs = queries(dashboard)
    assert len(exprs) >= 10
    for expr in exprs:
        names, matchers, grouping = metrics_of(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= set(series), f"{expr!r} asks for {sorted(names - set(series))}"
        for name, labels in matchers.items():
            assert labels <= series[name], f"{expr!r}: {name} has no {labels - series[name]}"
        known = set().union(*(series[name] for name in names))
        assert grouping <= known, f"{expr!r} groups by {grouping - known}"


def test_the_query_check_can_fail() -> None:
    series = exported()
    names, matchers, grouping = metrics_of(
        'sum by (tool) (rate(toolexec_invocation_total{outcom="failed"}[$__rate_interval]))')
    assert names == {"toolexec_invocation_total"} and not names <= set(series)
    assert matchers == {"toolexec_invocation_total": {"outcom"}}
    assert grouping == {"tool"}
    names, _, grouping = metrics_of(
        "histogram_quantile(0.95, sum by (le, step) (rate(toolexec_pipeline_step_seconds_bucket[5m])))")
    assert names == {"toolexec_pipeline_step_seconds_bucket"} and grouping == {"le", "step"}


def test_the_dashboard_covers_what_operators_watch(dashboard: dict) -> None:
    asked = set().union(*(metrics_of(expr)[0] for expr in queries(dashboard)))
    for metric in (toolexec.metrics.INVOCATIONS, toolexec.metrics.STARTED,
                   toolexec.metrics.CONSUMER_LAG, toolexec.metrics.CIRCUIT_STATE):
        assert any(name.startswith(metric._name) for name in asked), metric._name
    assert "toolexec_pipeline_step_seconds_bucket" in asked
    assert {"toolexec_decision_cache_hits_total", "toolexec_decision_cache_misses_total"} <= asked


def test_panels_use_the_provisioned_datasource(dashboard: dict) -> None:
    (source,) = DATASOURCES["datasources"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    used = {panel["datasource"]["uid"] for panel in dashboard["panels"]} | {
        target["datasource"]["uid"] for panel in dashboard["panels"]
        for target in panel["targets"]}
    assert used == {source["uid"]}
    assert source["url"] == f"http://prometheus:{_container_port('prometheus')}"


def _container_port(service: str) -> int:
    (mapping,) = SERVICES[service]["ports"]
    return int(str(mapping).rsplit(":", 1)[1])


def test_grafana_loads_the_dashboards_from_where_they_are_mounted() -> None:
    mounts = dict(volume.split(":")[:2] for volume in SERVICES["grafana"]["volumes"]
                  if volume.startswith("./"))
    (provider,) = PROVIDERS["providers"]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent == Path(provider["options"]["path"])
    assert (COMPOSE_DIR / "grafana" / "dashboards" / Path(home).name).is_file()


def test_prometheus_scrapes_every_gateway_replica() -> None:
    (job,) = PROMETHEUS["scrape_configs"]
    (sd,) = job["dns_sd_configs"]
    gateway_port = int(SERVICES["toolexec"]["environment"]["TOOLEXEC_GATEWAY_PORT"])
    assert sd["names"] == ["toolexec"] and sd["port"] == gateway_port
    assert job["metrics_path"] == "/metrics"
    mounts = [v.split(":")[:2] for v in SERVICES["prometheus"]["volumes"] if v.startswith("./")]
    assert ["./prometheus/prometheus.yml", "/etc/prometheus/prometheus.yml"] in mounts


def test_the_gateway_is_published_and_health_checked() -> None:
    toolexec = SERVICES["toolexec"]
    port = toolexec["environment"]["TOOLEXEC_GATEWAY_PORT"]
    assert _container_port("toolexec") == int(port)
    assert toolexec["environment"]["TOOLEXEC_GATEWAY_HOST"] == "0.0.0.0"
    check = " ".join(toolexec["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/health" in check
    for service in ("toolexec", "prometheus", "grafana"):
        assert str(SERVICES[service]["ports"][0]).startswith("127.0.0.1:")


def test_every_mounted_file_secret_and_volume_exists() -> None:
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (COMPOSE_DIR / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in COMPOSE["volumes"], f"{name}: undeclared volume {source}"
        for secret in service.get("secrets", []):
            assert secret in COMPOSE["secrets"], f"{name}: undeclared secret {secret}"
        for dependency in service.get("depends_on", {}):
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
    secrets_readme = (COMPOSE_DIR / "secrets" / "README.md").read_text()
    for secret in COMPOSE["secrets"].values():
        assert Path(secret["file"]).name in secrets_readme, secret["file"]


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian `prometheus`; .ci/run installs it): "
                           "PromQL syntax and prometheus.yml not checked by Prometheus itself")
def test_prometheus_parses_every_query_and_its_config(dashboard: dict, tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{n}", "expr": re.sub(r"\$__\w+", "5m", expr)}
        for n, expr in enumerate(queries(dashboard))]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")],
                             capture_output=True, text=True, timeout=WAIT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = subprocess.run(["promtool", "check", "config", "--syntax-only",
                             str(COMPOSE_DIR / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=WAIT)
    assert config.returncode == 0, config.stdout + config.stderr
