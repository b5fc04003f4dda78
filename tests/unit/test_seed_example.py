"""Seed 000's worked example, end to end through the pure domain:
data_processor 2.1.0 -> python_runtime 1.4.0 -> subprocess 1.0.0."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from domain.chain import resolve_chain
from domain.child_validation import ensure_chain_valid
from domain.errors import IntegrityMismatch
from domain.integrity import seal, verify_chain
from domain.lockfile import freeze, parse_lockfile, verify_lockfile
from domain.model import ResolvedChain, SubprocessPlan, ToolSource
from domain.plan import build_plan, merged_config
from domain.registry import InMemoryRegistry
from tests.unit.chain_builders import builtin, tool_file

# The reference example chain: python_runtime -> user_script, as its manifests were specified.
PYTHON_RUNTIME_YAML = r"""
tool_id: python_runtime
version: "1.4.0"
tool_type: runtime
executor: subprocess

config:
  command: "python3"
  base_args: ["-u"]
  install_deps: true
  venv:
    enabled: true
    path: ".venv"

validation:
  child_schemas:
    - match:
        tool_type: script
      schema:
        type: object
        properties:
          tool_id:
            type: string
            pattern: "^[a-z][a-z0-9_]*$"
          tool_type:
            const: script
          manifest:
            type: object
            properties:
              language:
                const: python
              entrypoint:
                type: string
                pattern: "\\.py$"
              requires:
                type: array
                items:
                  type: string
            required: [entrypoint]
        required: [tool_id, tool_type, manifest]
"""

DATA_PROCESSOR_YAML = """
tool_id: data_processor
version: "2.1.0"
tool_type: script
executor: python_runtime

manifest:
  language: python
  entrypoint: process_data.py
  requires:
    - pandas>=2.0
    - numpy

config:
  timeout: 1800
  env:
    PYTHONPATH: "/app/lib"
"""

PROCESS_DATA_PY = b"import json, sys\nprint(json.dumps({'rows': len(json.load(sys.stdin))}))\n"


def _sealed(text: str, *files: Any):
    return seal(ToolSource(yaml.safe_load(text), tuple(files), origin="seed-000"))


def _registry() -> InMemoryRegistry:
    older = yaml.safe_load(DATA_PROCESSOR_YAML) | {"version": "2.0.0"}
    return InMemoryRegistry([
        builtin("subprocess"),
        _sealed(PYTHON_RUNTIME_YAML),
        seal(ToolSource(older, (tool_file("process_data.py", PROCESS_DATA_PY),))),
        _sealed(DATA_PROCESSOR_YAML, tool_file("process_data.py", PROCESS_DATA_PY)),
    ])


def _chain() -> ResolvedChain:
    return resolve_chain(_registry(), "data_processor", "^2.0.0")


def test_the_seed_chain_resolves_leaf_to_primitive():
    assert [(tv.tool_id, tv.version) for tv in _chain().links] == [
        ("data_processor", "2.1.0"), ("python_runtime", "1.4.0"), ("subprocess", "1.0.0")]


def test_every_link_of_the_seed_chain_verifies():
    verify_chain(_chain(), cache=None)


def test_the_seed_chain_passes_parent_child_validation_in_strict_mode():
    assert ensure_chain_valid(_chain(), strict=True) == []


def test_the_seed_configs_merge_as_the_seed_shows():
    merged = merged_config(_chain())
    assert {k: merged[k] for k in ("command", "args", "env", "timeout")} == {
        "command": "python3", "args": ["-u", "process_data.py"],
        "env": {"PYTHONPATH": "/app/lib"}, "timeout": 1800}


def test_the_seed_chain_plans_the_subprocess_run():
    plan = build_plan(_chain())
    assert isinstance(plan, SubprocessPlan)
    assert plan.argv == ("python3", "-u", "process_data.py")
    assert plan.env == {"PYTHONPATH": "/app/lib"}
    assert plan.timeout_seconds == 1800
    assert [f.path for f in plan.files] == ["process_data.py"]


def test_one_tampered_byte_of_process_data_fails_naming_data_processor():
    chain = _chain()
    leaf = chain.leaf
    original = leaf.files[0]
    assert original.content is not None
    tampered_bytes = bytes([original.content[0] ^ 0x01]) + original.content[1:]
    tampered_leaf = replace(leaf, files=(replace(original, content=tampered_bytes),))
    with pytest.raises(IntegrityMismatch) as raised:
        verify_chain(ResolvedChain((tampered_leaf, *chain.links[1:])))
    assert raised.value.details["tool_id"] == "data_processor"
    assert raised.value.details["file"] == "process_data.py"


def test_the_seed_chain_round_trips_through_a_lockfile():
    registry = _registry()
    chain = resolve_chain(registry, "data_processor", "^2.0.0")
    lock = parse_lockfile(freeze(chain, generated_at="2026-01-24T12:00:00Z",
                                 registry_url="https://registry.example"))
    assert verify_lockfile(lock, registry).links == chain.links
