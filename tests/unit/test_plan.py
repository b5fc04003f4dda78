from __future__ import annotations

from typing import Any

import pytest

from domain.errors import ChainInvalid
from domain.model import HttpPlan, NetworkPolicy, ResolvedChain, ResourceLimits, SubprocessPlan
from domain.plan import build_plan, merged_config, parse_cpu, parse_size
from tests.unit.chain_builders import builtin, primitive, runtime, script, tool, tool_file


def _script_chain(**script_extra: Any) -> ResolvedChain:
    return ResolvedChain((script(**script_extra), builtin("python_runtime"), builtin("subprocess")))


def _subprocess_plan(**script_extra: Any) -> SubprocessPlan:
    plan = build_plan(_script_chain(**script_extra))
    assert isinstance(plan, SubprocessPlan)
    return plan


def _api_chain(config: dict[str, Any], **extra: Any) -> ResolvedChain:
    api = tool("weather", tool_type="api", executor="http_client", config=config, **extra)
    return ResolvedChain((api, builtin("http_client")))


def _http_plan(config: dict[str, Any], **extra: Any) -> HttpPlan:
    plan = build_plan(_api_chain(config, **extra))
    assert isinstance(plan, HttpPlan)
    return plan


# --------------------------------------------------------------------- merging


def test_args_concatenate_parent_first_with_the_entrypoint():
    assert _subprocess_plan().argv == ("python3", "-u", "main.py")


def test_script_args_follow_its_entrypoint():
    plan = _subprocess_plan(config={"entrypoint": "main.py", "args": ["--fast"]})
    assert plan.argv == ("python3", "-u", "main.py", "--fast")


def test_a_child_overrides_its_parent_and_mappings_merge_by_key():
    parent = runtime(config={"command": "python3", "env": {"A": "parent", "B": "parent"},
                             "venv": {"enabled": True, "path": ".venv"}})
    child = script(config={"entrypoint": "main.py", "env": {"B": "child"},
                           "venv": {"path": "env"}, "command": "python3.12"})
    merged = merged_config(ResolvedChain((child, parent, primitive())))
    assert merged["env"] == {"A": "parent", "B": "child"}
    assert merged["venv"] == {"enabled": True, "path": "env"}
    assert merged["command"] == "python3.12"


def test_seed_style_entrypoint_under_manifest_becomes_an_argument():
    plan = _subprocess_plan(config={}, manifest={"entrypoint": "main.py"})
    assert plan.argv[-1] == "main.py"


def test_an_entrypoint_escaping_the_tool_root_is_rejected():
    with pytest.raises(ChainInvalid, match="relative to the tool root"):
        build_plan(_script_chain(config={"entrypoint": "../etc/passwd.py"}))


def test_an_absolute_entrypoint_is_rejected():
    with pytest.raises(ChainInvalid):
        build_plan(_script_chain(config={"entrypoint": "/tmp/x.py"}))


def test_argv_is_never_a_shell_string_even_with_metacharacters():
    plan = _subprocess_plan(config={"entrypoint": "main.py", "args": ["; rm -rf /", "$(id)"]})
    assert plan.argv[-2:] == ("; rm -rf /", "$(id)")


def test_a_chain_without_command_cannot_plan_a_subprocess():
    chain = ResolvedChain((script(), runtime(config={"base_args": []}), builtin("subprocess")))
    with pytest.raises(ChainInvalid, match="config.command"):
        build_plan(chain)


# ------------------------------------------------------------------------- env


def test_env_holds_only_what_the_chain_declares_plus_base_env():
    plan = build_plan(_script_chain(config={"entrypoint": "main.py", "env": {"MODE": "fast"}}),
                      base_env={"PATH": "/usr/bin", "MODE": "slow"})
    assert plan.env == {"PATH": "/usr/bin", "MODE": "fast"}


def test_env_secret_references_stay_verbatim():
    plan = _subprocess_plan(config={"entrypoint": "main.py", "env": {"TOKEN": "${API_TOKEN}"}})
    assert plan.env == {"TOKEN": "${API_TOKEN}"}


def test_env_numbers_and_booleans_become_strings():
    plan = _subprocess_plan(config={"entrypoint": "main.py", "env": {"N": 3, "DEBUG": True}})
    assert plan.env == {"N": "3", "DEBUG": "true"}


def test_env_values_that_are_not_scalars_are_rejected():
    with pytest.raises(ChainInvalid):
        build_plan(_script_chain(config={"entrypoint": "main.py", "env": {"X": {"nested": 1}}}))


# --------------------------------------------------------------- timeout, limits


def test_timeout_defaults_to_30_seconds():
    assert _subprocess_plan().timeout_seconds == 30.0


def test_timeout_comes_from_the_leaf_timeout_default():
    assert _subprocess_plan(timeout_default=120).timeout_seconds == 120.0


def test_timeout_in_config_wins_over_timeout_default():
    plan = _subprocess_plan(config={"entrypoint": "main.py", "timeout": 5}, timeout_default=120)
    assert plan.timeout_seconds == 5.0


def test_resource_limits_convert_kubernetes_quantities():
    plan = _subprocess_plan(timeout_default=10, resource_limits={
        "memory": "2Gi", "cpu": "500m", "ephemeral_storage": "100Mi"})
    assert plan.limits.memory_bytes == 2 * 1024**3
    assert plan.limits.cpu_seconds == 5
    assert plan.limits.max_file_bytes == 100 * 1024**2


def test_cpu_seconds_round_up():
    plan = _subprocess_plan(timeout_default=3, resource_limits={"cpu": "333m"})
    assert plan.limits.cpu_seconds == 1


def test_without_resource_limits_the_model_defaults_apply():
    assert _subprocess_plan().limits == ResourceLimits()


def test_a_child_limit_overrides_the_runtime_limit():
    parent = runtime(resource_limits={"memory": "1Gi", "cpu": "2"})
    child = script(resource_limits={"memory": "256Mi"}, timeout_default=10)
    plan = build_plan(ResolvedChain((child, parent, builtin("subprocess"))))
    assert plan.limits.memory_bytes == 256 * 1024**2
    assert plan.limits.cpu_seconds == 20


@pytest.mark.parametrize(("text", "size"), [("512Mi", 512 * 1024**2), ("1Gi", 1024**3),
                                            ("100M", 100_000_000), ("4096", 4096), (10, 10)])
def test_parse_size(text: Any, size: int):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1Mi", "1.5Gi", None, "10\n", "\uff11\uff10", "1Gi "])
def test_parse_size_rejects_nonsense(text: Any):
    with pytest.raises(ChainInvalid):
        parse_size(text)


@pytest.mark.parametrize(("text", "cores"), [("500m", 0.5), ("2", 2.0), ("1.5", 1.5), (4, 4.0)])
def test_parse_cpu(text: Any, cores: float):
    assert parse_cpu(text) == cores


@pytest.mark.parametrize("text", ["2\n", "\u0662", "0", "-1", "1.", "m"])
def test_parse_cpu_rejects_nonsense(text: Any):
    with pytest.raises(ChainInvalid):
        parse_cpu(text)


@pytest.mark.parametrize("name", ["A\n", "A=B", "A\x00", "", "\nA"])
def test_env_names_that_execve_would_garble_are_rejected(name: str):
    with pytest.raises(ChainInvalid):
        build_plan(_script_chain(config={"entrypoint": "main.py", "env": {name: "x"}}))


def test_network_policy_is_carried_into_the_plan():
    plan = _subprocess_plan(network_policy={"allowed_domains": ["api.example.com"],
                                            "allowed_ports": [443], "deny_all_egress": False})
    assert plan.network == NetworkPolicy(("api.example.com",), (443,), False)


def test_cwd_defaults_to_the_tool_root():
    assert _subprocess_plan().cwd == "."


# ------------------------------------------------------------------------- files


def test_plan_files_are_the_leaf_and_runtime_files():
    helper = tool_file("lib/helper.py", b"x = 1\n")
    parent = runtime(files=(helper, tool_file("main.py", b"runtime's\n")))
    chain = ResolvedChain((script(), parent, builtin("subprocess")))
    plan = build_plan(chain)
    assert [f.path for f in plan.files] == ["lib/helper.py", "main.py"]
    assert next(f for f in plan.files if f.path == "main.py").content == b"print('hi')\n"


# -------------------------------------------------------------------------- http


def test_an_api_tool_plans_an_http_request():
    plan = _http_plan({"method": "get", "url_template": "https://api.example.com/{city}",
                       "headers": {"Authorization": "Bearer ${WEATHER_KEY}"},
                       "query": {"units": "metric", "days": 3}}, timeout_default=12)
    assert plan.method == "GET"
    assert plan.url_template == "https://api.example.com/{city}"
    assert plan.headers == {"Authorization": "Bearer ${WEATHER_KEY}"}
    assert plan.query == {"units": "metric", "days": "3"}
    assert plan.body_from_params is False
    assert plan.timeout_seconds == 12.0


def test_non_get_requests_send_params_as_body_by_default():
    assert _http_plan({"method": "POST", "url": "https://api.example.com"}).body_from_params


def test_body_from_params_can_be_turned_off():
    plan = _http_plan({"method": "POST", "url": "https://x.example", "body_from_params": False})
    assert plan.body_from_params is False


def test_retry_status_codes_come_from_the_retry_policy():
    plan = _http_plan({"method": "GET", "url": "https://x.example"},
                      retry_policy={"retry_on_status_codes": [503]})
    assert plan.retry_on_status_codes == (503,)


def test_retry_status_codes_default_to_the_model():
    plan = _http_plan({"method": "GET", "url": "https://x.example"})
    assert plan.retry_on_status_codes == HttpPlan("GET", "u").retry_on_status_codes


def test_an_api_tool_without_url_cannot_plan():
    with pytest.raises(ChainInvalid, match="url"):
        build_plan(_api_chain({"method": "GET"}))
