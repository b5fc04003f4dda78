from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from domain.manifest import normalise_manifest
from domain.model import Issue, ToolFile, ToolSource
from domain.validation import json_path, validate_parameters, validate_source

HELLO_PY = b'import json, sys\nprint(json.dumps({"greeting": "hi"}))\n'


def tool_file(path: str, content: bytes, executable: bool = False) -> ToolFile:
    return ToolFile(path, hashlib.sha256(content).hexdigest(), executable, content)


def source(manifest: dict[str, Any], *files: ToolFile) -> ToolSource:
    return ToolSource(normalise_manifest(manifest), tuple(files), origin="test")


def script(**overrides: Any) -> dict[str, Any]:
    return {"tool_id": "hello", "version": "1.0.0", "tool_type": "script",
            "executor": "python_runtime", "config": {"entrypoint": "main.py"},
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
            **overrides}


def api(**config: Any) -> dict[str, Any]:
    return {"tool_id": "weather", "version": "1.0.0", "tool_type": "api",
            "executor": "http_client",
            "config": {"method": "GET", "url_template": "https://api.example.com/{city}", **config},
            "parameters": [{"name": "city", "type": "string", "required": True}]}


def mcp_server(**config: Any) -> dict[str, Any]:
    return {"tool_id": "github_mcp", "version": "1.0.0", "tool_type": "mcp_server",
            "executor": "subprocess", "config": config}


def paths(issues: list[Issue]) -> list[str]:
    return sorted(issue.path for issue in issues)


def errors(issues: list[Issue]) -> list[Issue]:
    return [issue for issue in issues if issue.severity == "error"]


# ------------------------------------------------------------------------- layer 1


def test_valid_script_tool_has_no_issues() -> None:
    assert validate_source(source(script(), tool_file("main.py", HELLO_PY))) == []


def test_manifest_with_three_problems_yields_three_issues() -> None:
    broken = script(tool_id="Hello-Tool", version="1.0", timeout_default=0)
    issues = validate_source(source(broken, tool_file("main.py", HELLO_PY)))
    assert paths(issues) == ["$.timeout_default", "$.tool_id", "$.version"]


def test_missing_required_fields_are_reported_at_their_own_paths() -> None:
    issues = validate_source(source({"executor": "x_runtime"}))
    assert paths(issues) == ["$.tool_id", "$.tool_type", "$.version"]
    assert "tool_id is required" in [issue.message for issue in issues]


def test_tool_id_must_be_snake_case() -> None:
    issues = validate_source(source(script(tool_id="Hello"), tool_file("main.py", HELLO_PY)))
    assert [(i.path, "snake_case" in i.message) for i in issues] == [("$.tool_id", True)]


def test_version_with_leading_zero_is_not_semver() -> None:
    issues = validate_source(source(script(version="01.0.0"), tool_file("main.py", HELLO_PY)))
    assert paths(issues) == ["$.version"]


def test_unknown_tool_type_is_reported() -> None:
    issues = validate_source(source(script(tool_type="lambda"), tool_file("main.py", HELLO_PY)))
    assert paths(issues) == ["$.tool_type"]


def test_nested_schema_errors_carry_their_json_path() -> None:
    manifest = script(retry_policy={"max_attempts": 99},
                      network_policy={"allowed_ports": [80, 70000]})
    issues = validate_source(source(manifest, tool_file("main.py", HELLO_PY)))
    assert paths(issues) == ["$.network_policy.allowed_ports[1]", "$.retry_policy.max_attempts"]


def test_invalid_parameter_schema_is_reported() -> None:
    manifest = script(parameters={"type": "object", "properties": {"n": {"type": "strnig"}}})
    issues = validate_source(source(manifest, tool_file("main.py", HELLO_PY)))
    assert paths(issues) == ["$.parameters.properties.n.type"]


def test_primitive_with_an_executor_is_rejected() -> None:
    primitive = {"tool_id": "subprocess", "version": "1.0.0", "tool_type": "primitive",
                 "executor": "python_runtime"}
    assert paths(validate_source(source(primitive))) == ["$.executor"]


def test_primitive_must_be_named_subprocess_or_http_client() -> None:
    primitive = {"tool_id": "shell_exec", "version": "1.0.0", "tool_type": "primitive",
                 "executor": None}
    issues = validate_source(source(primitive))
    assert paths(issues) == ["$.tool_id"] and "subprocess" in issues[0].message


def test_knowledge_entry_must_not_have_an_executor() -> None:
    entry = {"tool_id": "notes", "version": "1.0.0", "tool_type": "knowledge",
             "executor": "python_runtime"}
    issues = validate_source(source(entry, tool_file("notes.md", b"---\na: 1\n---\n")))
    assert paths(issues) == ["$.executor"]


def test_non_primitive_without_executor_is_reported() -> None:
    issues = validate_source(source(script(executor=None), tool_file("main.py", HELLO_PY)))
    assert paths(issues) == ["$.executor"] and "requires an executor" in issues[0].message


def test_tool_cannot_be_its_own_executor() -> None:
    manifest = mcp_server(transport="stdio", command="npx") | {"executor": "github_mcp"}
    assert "$.executor" in paths(validate_source(source(manifest)))


def test_conflicting_executor_alias_is_reported() -> None:
    manifest = script(executor_id="bash_runtime")
    assert paths(validate_source(source(manifest, tool_file("main.py", HELLO_PY)))) == ["$.executor_id"]


# ----------------------------------------------------------------------- scripts


def test_script_without_files_reports_files_and_entrypoint() -> None:
    assert paths(validate_source(source(script()))) == ["$.config.entrypoint", "$.files"]


def test_script_without_entrypoint_is_reported() -> None:
    manifest = script(config={})
    assert paths(validate_source(source(manifest, tool_file("main.py", HELLO_PY)))) == [
        "$.config.entrypoint"]


def test_entrypoint_in_manifest_section_is_accepted() -> None:
    manifest = script(config={}, manifest={"language": "python", "entrypoint": "main.py"})
    assert validate_source(source(manifest, tool_file("main.py", HELLO_PY))) == []


def test_entrypoint_not_among_files_is_reported() -> None:
    issues = validate_source(source(script(), tool_file("run.py", HELLO_PY)))
    assert [i.path for i in issues] == ["$.config.entrypoint"]
    assert "not among the tool's files" in issues[0].message


def test_entrypoint_escaping_the_tool_root_is_reported() -> None:
    manifest = script(config={"entrypoint": "../main.py"})
    issues = validate_source(source(manifest, tool_file("main.py", HELLO_PY)))
    assert "inside the tool" in issues[0].message


def test_python_syntax_error_reports_file_and_line() -> None:
    bad = tool_file("lib/util.py", b"x = 1\ndef broken(:\n    pass\n")
    issues = validate_source(source(script(), tool_file("main.py", HELLO_PY), bad))
    assert [i.path for i in issues] == ["$.files['lib/util.py']"]
    assert "line 2" in issues[0].message


def test_python_syntax_warning_is_a_warning_not_an_error() -> None:
    issues = validate_source(source(script(), tool_file("main.py", b"x = 1\nprint(x is 1)\n")))
    assert [i.severity for i in issues] == ["warning"]


def test_bash_syntax_is_checked_through_the_injected_checker() -> None:
    seen: list[str] = []

    def checker(text: str) -> str | None:
        seen.append(text)
        return "line 2: syntax error near unexpected token `fi'"

    manifest = script(executor="bash_runtime", config={"entrypoint": "run.sh"})
    issues = validate_source(source(manifest, tool_file("run.sh", b"echo hi\nfi\n")),
                             bash_syntax=checker)
    assert seen == ["echo hi\nfi\n"]
    assert [i.path for i in issues] == ["$.files['run.sh']"] and "line 2" in issues[0].message


def test_bash_files_are_skipped_without_a_checker() -> None:
    manifest = script(executor="bash_runtime", config={"entrypoint": "run.sh"})
    assert validate_source(source(manifest, tool_file("run.sh", b"fi\n"))) == []


def test_script_executor_must_be_a_runtime_by_name() -> None:
    issues = validate_source(source(script(executor="http_client"), tool_file("main.py", HELLO_PY)))
    assert paths(issues) == ["$.executor"]


def test_script_executor_type_is_checked_against_known_tools() -> None:
    manifest = script(executor="py3")
    issues = validate_source(source(manifest, tool_file("main.py", HELLO_PY)),
                             known_tools={"py3": "api"})
    assert paths(issues) == ["$.executor"] and "'py3' is an api" in issues[0].message


def test_known_runtime_without_runtime_suffix_is_accepted() -> None:
    manifest = script(executor="py3")
    assert validate_source(source(manifest, tool_file("main.py", HELLO_PY)),
                           known_tools={"py3": "runtime"}) == []


def test_broken_script_lists_all_its_issues_at_once() -> None:
    manifest = script(version="one", executor="http_client", config={"entrypoint": "app.py"})
    issues = validate_source(source(manifest, tool_file("main.py", b"def (:\n")))
    assert paths(issues) == ["$.config.entrypoint", "$.executor", "$.files['main.py']",
                             "$.version"]


# -------------------------------------------------------------------------- api


def test_valid_api_tool_has_no_issues() -> None:
    assert validate_source(source(api())) == []


def test_api_template_variable_without_parameter_is_reported() -> None:
    issues = validate_source(source(api(url_template="https://x.example/{city}/{day}")))
    assert [(i.path, "{day}" in i.message) for i in issues] == [("$.config.url_template", True)]


def test_api_invalid_method_is_reported() -> None:
    assert paths(validate_source(source(api(method="FETCH")))) == ["$.config.method"]


def test_api_without_url_is_reported() -> None:
    manifest = api()
    del manifest["config"]["url_template"]
    assert paths(validate_source(source(manifest))) == ["$.config.url_template"]


def test_api_url_must_be_http_or_https() -> None:
    manifest = api()
    manifest["config"] = {"method": "GET", "url": "ftp://files.example.com/x"}
    assert paths(validate_source(source(manifest))) == ["$.config.url"]


def test_api_executor_must_be_http_client() -> None:
    assert paths(validate_source(source(api() | {"executor": "subprocess"}))) == ["$.executor"]


def test_api_with_four_problems_yields_four_issues() -> None:
    manifest = api(method="get", url_template="file:///{path}") | {"executor": "subprocess"}
    assert paths(validate_source(source(manifest))) == [
        "$.config.method", "$.config.url_template", "$.config.url_template", "$.executor"]


# -------------------------------------------------------------------------- mcp


def test_mcp_tool_needs_mcp_tool_name() -> None:
    manifest = {"tool_id": "gh_issue", "version": "1.0.0", "tool_type": "mcp_tool",
                "executor": "github_mcp", "config": {}}
    assert paths(validate_source(source(manifest))) == ["$.config.mcp_tool_name"]


def test_mcp_tool_executor_must_be_a_known_mcp_server() -> None:
    manifest = {"tool_id": "gh_issue", "version": "1.0.0", "tool_type": "mcp_tool",
                "executor": "python_runtime", "config": {"mcp_tool_name": "create_issue"}}
    issues = validate_source(source(manifest), known_tools={"python_runtime": "runtime"})
    assert paths(issues) == ["$.executor"]


def test_stdio_server_needs_a_command() -> None:
    assert paths(validate_source(source(mcp_server(transport="stdio")))) == ["$.config.command"]


def test_stdio_server_args_must_be_strings() -> None:
    manifest = mcp_server(transport="stdio", command="npx", args=["-y", 3])
    assert paths(validate_source(source(manifest))) == ["$.config.args[1]"]


@pytest.mark.parametrize("transport", ["sse", "streamable_http", "websocket"])
def test_network_transports_need_a_url(transport: str) -> None:
    manifest = mcp_server(transport=transport) | {"executor": "http_client"}
    assert paths(validate_source(source(manifest))) == ["$.config.url"]


def test_network_transport_through_subprocess_is_reported() -> None:
    manifest = mcp_server(transport="sse", url="https://mcp.example.com/sse")
    assert paths(validate_source(source(manifest))) == ["$.executor"]


def test_stdio_server_through_http_client_is_reported() -> None:
    manifest = mcp_server(transport="stdio", command="npx") | {"executor": "http_client"}
    assert paths(validate_source(source(manifest))) == ["$.executor"]


@pytest.mark.parametrize("startup", [0, -1, "soon", True])
def test_startup_timeout_must_be_a_positive_number(startup: object) -> None:
    manifest = mcp_server(transport="stdio", command="npx", startup_timeout=startup)
    assert paths(validate_source(source(manifest))) == ["$.config.startup_timeout"]


def test_unknown_transport_is_reported() -> None:
    assert paths(validate_source(source(mcp_server(transport="pigeon")))) == ["$.config.transport"]


def test_mcp_server_executor_must_be_a_primitive() -> None:
    manifest = mcp_server(transport="stdio", command="npx") | {"executor": "python_runtime"}
    assert paths(validate_source(source(manifest))) == ["$.executor"]


# --------------------------------------------------------- runtime, knowledge, directive


def test_runtime_needs_command_or_url_and_a_primitive_executor() -> None:
    manifest = {"tool_id": "ruby_runtime", "version": "1.0.0", "tool_type": "runtime",
                "executor": "python_runtime", "config": {}}
    assert paths(validate_source(source(manifest))) == ["$.config.command", "$.executor"]


def test_knowledge_needs_a_markdown_file() -> None:
    entry = {"tool_id": "notes", "version": "1.0.0", "tool_type": "knowledge"}
    assert paths(validate_source(source(entry, tool_file("notes.txt", b"x")))) == ["$.files"]


@pytest.mark.parametrize("content", [b"# no frontmatter\n", b"---\n[1, 2]\n---\n",
                                     b"---\na: [\n---\n"])
def test_knowledge_frontmatter_must_parse_as_a_mapping(content: bytes) -> None:
    entry = {"tool_id": "notes", "version": "1.0.0", "tool_type": "knowledge"}
    assert paths(validate_source(source(entry, tool_file("notes.md", content)))) == [
        "$.files['notes.md']"]


def test_directive_needs_a_file() -> None:
    directive = {"tool_id": "review", "version": "1.0.0", "tool_type": "directive",
                 "executor": "llm_runtime"}
    assert paths(validate_source(source(directive))) == ["$.files"]


# ----------------------------------------------------------------------- layer 3


SCHEMA = {"type": "object", "properties": {
    "email": {"type": "string", "format": "email"},
    "count": {"type": "integer", "minimum": 1},
    "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["email", "count"], "additionalProperties": False}


def test_valid_parameters_have_no_issues() -> None:
    assert validate_parameters(SCHEMA, {"email": "a@example.com", "count": 2}) == []


def test_all_parameter_violations_are_reported_with_paths() -> None:
    issues = validate_parameters(SCHEMA, {"email": "nope", "tags": ["a", 1], "extra": True})
    assert paths(issues) == ["$", "$.count", "$.email", "$.tags[1]"]


def test_parameter_formats_are_checked() -> None:
    assert paths(validate_parameters(SCHEMA, {"email": "not-an-email", "count": 1})) == ["$.email"]


def test_invalid_parameter_schema_becomes_an_issue() -> None:
    issues = validate_parameters({"type": "objekt"}, {})
    assert paths(issues) == ["$"] and "invalid" in issues[0].message


def test_equal_schemas_share_one_compiled_validator() -> None:
    from domain.schema_cache import validator_for

    assert validator_for(dict(SCHEMA)) is validator_for(dict(SCHEMA))


@pytest.mark.parametrize(("parts", "expected"), [
    (["config", "entrypoint"], "$.config.entrypoint"),
    (["files", "main.py"], "$.files['main.py']"),
    (["args", 0], "$.args[0]"),
])
def test_json_paths_are_rendered_readably(parts: list[str | int], expected: str) -> None:
    assert json_path(parts) == expected


def test_validation_is_deterministic() -> None:
    make: Callable[[], ToolSource] = lambda: source(script(version="x", tool_id="A"))  # noqa: E731
    assert validate_source(make()) == validate_source(make())


def test_disagreeing_entrypoints_are_reported() -> None:
    manifest = script(manifest={"entrypoint": "other.py"})
    issues = validate_source(source(manifest, tool_file("main.py", HELLO_PY),
                                    tool_file("other.py", HELLO_PY)))
    assert paths(issues) == ["$.manifest.entrypoint"]


def test_executor_reference_may_carry_a_version_range() -> None:
    manifest = script(executor="python_runtime@^1.0")
    assert validate_source(source(manifest, tool_file("main.py", HELLO_PY)),
                           known_tools={"python_runtime": "runtime"}) == []


def test_invalid_executor_version_range_is_reported() -> None:
    manifest = script(executor="python_runtime@not-a-range")
    issues = validate_source(source(manifest, tool_file("main.py", HELLO_PY)))
    assert paths(issues) == ["$.executor"] and "range" in issues[0].message
