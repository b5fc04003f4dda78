from __future__ import annotations

from typing import Any

import pytest

from domain.child_validation import (
    child_document,
    ensure_chain_valid,
    validate_chain,
    validate_pair,
)
from domain.errors import ChainInvalid
from domain.model import ResolvedChain
from tests.unit.chain_builders import builtin, runtime, script, tool, tool_file


def _chain(*links) -> ResolvedChain:
    return ResolvedChain(tuple(links))


def test_a_python_script_passes_the_builtin_chain_in_strict_mode():
    chain = _chain(script(), builtin("python_runtime"), builtin("subprocess"))
    assert ensure_chain_valid(chain, strict=True) == []


def test_seed_style_script_details_under_manifest_are_accepted():
    leaf = script(config={}, manifest={"language": "python", "entrypoint": "main.py"})
    assert validate_pair(leaf, builtin("python_runtime"), strict=True) == ([], [])


def test_the_child_document_lifts_config_entrypoint_into_manifest():
    document = child_document(script(config={"entrypoint": "main.py", "language": "python"}))
    assert document["manifest"]["entrypoint"] == "main.py"
    assert document["manifest"]["language"] == "python"
    assert document["config"]["entrypoint"] == "main.py"
    assert document["files"][0]["path"] == "main.py"


def test_a_shell_script_is_rejected_by_the_python_runtime():
    leaf = script(config={"entrypoint": "run.sh"}, files=(tool_file("run.sh", b"echo\n"),))
    issues, _ = validate_pair(leaf, builtin("python_runtime"), strict=True)
    assert [i.path for i in issues] == ["$.manifest.entrypoint"]
    assert "python_runtime@1.0.0 rejects hello@1.0.0" in issues[0].message


def test_a_script_declaring_another_language_is_rejected():
    leaf = script(manifest={"language": "ruby", "entrypoint": "main.py"})
    issues, _ = validate_pair(leaf, builtin("python_runtime"), strict=True)
    assert [i.path for i in issues] == ["$.manifest.language"]


def test_a_script_without_entrypoint_is_reported_at_the_missing_key():
    issues, _ = validate_pair(script(config={}), builtin("python_runtime"), strict=True)
    assert [i.path for i in issues] == ["$.manifest.entrypoint"]


@pytest.mark.parametrize(("runtime_name", "entrypoint"), [
    ("bash_runtime", "run.sh"), ("node_runtime", "index.js"), ("node_runtime", "main.mjs"),
])
def test_each_builtin_runtime_accepts_its_own_scripts(runtime_name: str, entrypoint: str):
    leaf = script(executor=runtime_name, config={"entrypoint": entrypoint},
                  files=(tool_file(entrypoint, b"x\n"),))
    chain = _chain(leaf, builtin(runtime_name), builtin("subprocess"))
    assert ensure_chain_valid(chain, strict=True) == []


def test_the_subprocess_primitive_accepts_a_stdio_mcp_server():
    server = tool("files_mcp", tool_type="mcp_server", executor="subprocess",
                  config={"transport": "stdio", "command": "npx", "args": ["server"]})
    assert validate_pair(server, builtin("subprocess"), strict=True) == ([], [])


def test_the_http_client_accepts_an_api_tool():
    api = tool("weather", tool_type="api", executor="http_client",
               config={"method": "GET", "url_template": "https://api.example.com/{city}"})
    assert validate_pair(api, builtin("http_client"), strict=True) == ([], [])


def test_the_http_client_rejects_an_api_tool_without_url():
    api = tool("weather", tool_type="api", executor="http_client", config={"method": "GET"})
    issues, _ = validate_pair(api, builtin("http_client"), strict=True)
    assert [i.path for i in issues] == ["$.config"]


def test_no_matching_child_schema_is_an_error_even_when_lenient():
    issues, _ = validate_pair(script(executor="subprocess"), builtin("subprocess"), strict=False)
    assert "has no child schema matching hello@1.0.0" in issues[0].message


def _schemaless_runtime():
    return runtime(validation={})


def test_a_parent_without_child_schemas_is_an_error_in_strict_mode():
    issues, warnings = validate_pair(script(), _schemaless_runtime(), strict=True)
    assert "defines no validation.child_schemas" in issues[0].message
    assert warnings == []


def test_a_parent_without_child_schemas_is_a_warning_in_lenient_mode():
    issues, warnings = validate_pair(script(), _schemaless_runtime(), strict=False)
    assert issues == []
    assert "defines no validation.child_schemas" in warnings[0]


def test_the_first_matching_entry_decides():
    schemas: list[dict[str, Any]] = [
        {"match": {"tool_type": "script", "tool_id": "special"}, "schema": {"not": {}}},
        {"match": {"tool_type": "script"}, "schema": {"type": "object"}},
    ]
    parent = runtime(validation={"child_schemas": schemas})
    assert validate_pair(script("hello"), parent)[0] == []
    assert validate_pair(script("special"), parent)[0] != []


def test_an_invalid_child_schema_is_reported_not_raised():
    parent = runtime(validation={"child_schemas": [{"match": {}, "schema": {"type": 5}}]})
    issues, _ = validate_pair(script(), parent, strict=True)
    assert "not a valid JSON Schema" in issues[0].message


def test_validate_chain_collects_issues_of_every_pair():
    leaf = script(config={"entrypoint": "run.sh"})
    commandless = runtime(config={"base_args": ["-u"]},
                          validation=builtin("python_runtime").manifest["validation"])
    issues, _ = validate_chain(_chain(leaf, commandless, builtin("subprocess")), strict=True)
    assert sorted(i.path for i in issues) == ["$.config.command", "$.manifest.entrypoint"]


def test_ensure_chain_valid_raises_with_every_issue_in_details():
    leaf = script(config={"entrypoint": "run.sh"})
    with pytest.raises(ChainInvalid) as raised:
        ensure_chain_valid(_chain(leaf, builtin("python_runtime"), builtin("subprocess")))
    assert raised.value.code == "E3105"
    assert raised.value.details["issues"][0]["path"] == "$.manifest.entrypoint"


def test_lenient_chain_validation_returns_the_warnings():
    warnings = ensure_chain_valid(_chain(script(), _schemaless_runtime(), builtin("subprocess")))
    assert len(warnings) == 1


def test_a_chain_of_one_primitive_has_nothing_to_validate():
    assert ensure_chain_valid(_chain(builtin("subprocess")), strict=True) == []
