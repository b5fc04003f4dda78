"""What runs is decided by the runtime: a child cannot swap its parent's interpreter."""

from __future__ import annotations

from typing import Any

import pytest

from domain.errors import ChainInvalid
from domain.model import ResolvedChain, SubprocessPlan
from domain.plan import build_plan
from tests.unit.chain_builders import builtin, runtime, script


def _build(leaf_config: dict[str, Any], *, runtime_config: dict[str, Any] | None = None,
           allows: dict[str, Any] | None = None) -> SubprocessPlan:
    validation = {"child_schemas": [{"match": {"tool_type": "script"}, "schema": {
        "type": "object", "properties": {"config": {"type": "object",
                                                    "properties": allows or {}}}}}]}
    parent = runtime(config=runtime_config or {"command": "python3", "base_args": ["-u"],
                                               "env": {"PYTHONSAFEPATH": "1"}},
                     validation=validation)
    plan = build_plan(ResolvedChain((script(config={"entrypoint": "main.py", **leaf_config}),
                                     parent, builtin("subprocess"))))
    assert isinstance(plan, SubprocessPlan)
    return plan


@pytest.mark.parametrize(("config", "key"), [
    ({"command": "/bin/python3"}, "config.command"),
    ({"base_args": ["-c", "import os"]}, "config.base_args"),
    ({"env": {"PYTHONSAFEPATH": ""}}, "config.env.PYTHONSAFEPATH"),
])
def test_a_script_cannot_change_what_its_runtime_set(config: dict[str, Any], key: str) -> None:
    with pytest.raises(ChainInvalid) as refused:
        _build(config)
    assert refused.value.code == "E3105"
    assert refused.value.details["key"] == key


def test_the_builtin_python_runtime_does_not_let_scripts_swap_its_interpreter() -> None:
    leaf = script(config={"entrypoint": "main.py", "command": "/bin/python3"})
    with pytest.raises(ChainInvalid, match="config.command"):
        build_plan(ResolvedChain((leaf, builtin("python_runtime"), builtin("subprocess"))))


def test_a_child_schema_naming_the_key_allows_it() -> None:
    plan = _build({"command": "python3.12"}, allows={"command": {"type": "string"}})
    assert plan.argv[0] == "python3.12"


def test_a_script_may_add_its_own_variables_arguments_and_timeout() -> None:
    plan = _build({"env": {"MODE": "fast"}, "args": ["--x"], "timeout": 5})
    assert plan.env == {"PYTHONSAFEPATH": "1", "MODE": "fast"}
    assert plan.argv == ("python3", "-u", "main.py", "--x")
    assert plan.timeout_seconds == 5


def test_a_key_the_runtime_did_not_set_is_the_scripts_to_set() -> None:
    plan = _build({"command": "node"}, runtime_config={"base_args": []})
    assert plan.argv[0] == "node"
