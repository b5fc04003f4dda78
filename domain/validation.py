"""Manifest-driven validation of tool sources (layers 1 and 2) and parameters (layer 3).

Layer 1 is universal: the manifest against `MANIFEST_SCHEMA`, semantic version,
executor rules. Layer 2 depends on `tool_type` (script files and syntax, API method and
URL, MCP transport...). Layer 3 checks invocation parameters against the tool's schema.

Every check runs and every finding is returned, each with a JSON path into the
manifest (`$.config.entrypoint`) or the file tree (`$.files['main.py']`), so an author
fixes all problems in one pass. Nothing here reads files or runs processes: Bash syntax
checking is injected as a callable.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import rfc8785
import semantic_version
import yaml
from jsonschema import SchemaError, ValidationError

from domain.errors import RequestError
from domain.manifest import MANIFEST_SCHEMA, split_frontmatter
from domain.model import PRIMITIVES, Issue, ToolFile, ToolSource
from domain.paths import relative_parts
from domain.safe_yaml import YamlTooLarge, load_yaml
from domain.schema_cache import validator_for
from domain.semver import parse_range

BashSyntax = Callable[[str], str | None]

HTTP_METHODS: tuple[str, ...] = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
MCP_TRANSPORTS: tuple[str, ...] = ("stdio", "sse", "streamable_http", "websocket")
NO_EXECUTOR_TYPES: frozenset[str] = frozenset({"primitive", "knowledge"})

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE_VARIABLE = re.compile(r"\{([^{}]*)\}")
_FRIENDLY_PATTERN_MESSAGES: dict[str, str] = {
    "$.tool_id": "tool_id {value!r} must be snake_case: a lowercase letter, then "
    "lowercase letters, digits or underscores",
    "$.version": "version {value!r} is not a semantic version (MAJOR.MINOR.PATCH)",
    "$.executor": "executor {value!r} must be the tool_id of another tool (snake_case), "
    "optionally followed by @<semver range>",
}


# ---------------------------------------------------------------------------- paths


def json_path(parts: Iterable[str | int], root: str = "$") -> str:
    """Render path parts as a JSON path: `$.config.entrypoint`, `$.files['main.py']`,
    `$.args[0]`."""
    rendered = root
    for part in parts:
        if isinstance(part, int):
            rendered += f"[{part}]"
        elif _IDENTIFIER.match(part):
            rendered += f".{part}"
        else:
            rendered += f"[{part!r}]"
    return rendered


def _file_path(path: str) -> str:
    return json_path(["files", path])


# -------------------------------------------------------------- JSON Schema errors


def schema_issues(errors: Iterable[ValidationError], root: str = "$") -> list[Issue]:
    """Turn jsonschema errors into issues, one per violation, sorted by path. A missing
    required property is reported at the property's own path."""
    issues: list[Issue] = []
    for error in errors:
        issues.append(_issue_of(error, root))
    return sorted(issues, key=lambda issue: issue.path)


def _issue_of(error: ValidationError, root: str) -> Issue:
    parts = list(error.absolute_path)
    if error.validator == "required":
        missing = _missing_property(error)
        if missing is not None:
            return Issue(json_path([*parts, missing], root), f"{missing} is required")
    path = json_path(parts, root)
    if error.validator == "pattern" and path in _FRIENDLY_PATTERN_MESSAGES:
        return Issue(path, _FRIENDLY_PATTERN_MESSAGES[path].format(value=error.instance))
    return Issue(path, _shorten(error.message))


def _missing_property(error: ValidationError) -> str | None:
    required = error.validator_value if isinstance(error.validator_value, list) else []
    for name in required:
        if isinstance(name, str) and error.message.startswith(f"{name!r} "):
            return name
    return None


def _shorten(message: str, limit: int = 300) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


# ------------------------------------------------------------------ public entry points


def validate_source(
    source: ToolSource,
    *,
    bash_syntax: BashSyntax | None = None,
    known_tools: Mapping[str, str] | None = None,
) -> list[Issue]:
    """Validate a tool source (layers 1 and 2) and return every issue found.

    `bash_syntax` returns an error message for a Bash text, or None when it parses
    (None: Bash files are not checked). `known_tools` maps tool_id -> tool_type of the
    tools around (registry, sibling sources); when it knows a tool's executor, the
    executor's type is checked, otherwise naming conventions are used.
    """
    manifest = source.manifest
    issues = _layer_one(manifest)
    issues.extend(_output_issues(manifest))
    config = manifest.get("config", {})
    tool_type = manifest.get("tool_type")
    check = _TYPE_CHECKS.get(tool_type) if isinstance(tool_type, str) else None
    if check is not None and isinstance(config, Mapping):
        context = _Context(manifest, config, source.files, bash_syntax, dict(known_tools or {}))
        issues.extend(check(context))
    return issues


def validate_parameters(schema: Mapping[str, Any], params: Mapping[str, Any]) -> list[Issue]:
    """Layer 3: validate invocation parameters against a tool's parameter schema
    (Draft 2020-12, formats checked) and return every violation, paths rooted at `$`.
    Compiled validators are cached by the schema's canonical JSON."""
    try:
        validator = validator_for(schema)
    except SchemaError as error:
        return [Issue("$", f"the tool's parameter schema is invalid: {_shorten(error.message)}")]
    except (rfc8785.CanonicalizationError, TypeError) as error:
        return [Issue("$", f"the tool's parameter schema is not JSON: {error}")]
    return schema_issues(validator.iter_errors(params))


# ----------------------------------------------------------------------------- layer 1


def _layer_one(manifest: Mapping[str, Any]) -> list[Issue]:
    issues = schema_issues(validator_for(MANIFEST_SCHEMA).iter_errors(manifest))
    reported = {issue.path for issue in issues}
    for issue in [*_version_issues(manifest), *_executor_issues(manifest)]:
        if issue.path not in reported:
            issues.append(issue)
            reported.add(issue.path)
    return issues


def _version_issues(manifest: Mapping[str, Any]) -> list[Issue]:
    version = manifest.get("version")
    if isinstance(version, str) and not semantic_version.validate(version):
        return [Issue("$.version", f"version {version!r} is not a valid semantic version "
                                   "(no leading zeros in numeric parts)")]
    return []


def executor_name(reference: Any) -> str | None:
    """The tool_id part of an executor reference (`python_runtime@^1.0` ->
    `python_runtime`); None when there is no usable reference."""
    if not isinstance(reference, str):
        return None
    name = reference.partition("@")[0].strip()
    return name or None


def _executor_issues(manifest: Mapping[str, Any]) -> list[Issue]:
    tool_type = manifest.get("tool_type")
    executor = manifest.get("executor")
    tool_id = manifest.get("tool_id")
    issues: list[Issue] = _executor_range_issues(executor)
    if "executor_id" in manifest:
        issues.append(Issue("$.executor_id", f"executor_id {manifest['executor_id']!r} "
                                             f"disagrees with executor {executor!r}; keep one"))
    if tool_type in NO_EXECUTOR_TYPES:
        if executor is not None:
            label = "primitives" if tool_type == "primitive" else "knowledge entries"
            issues.append(Issue("$.executor", f"{label} must have executor: null, "
                                              f"got {executor!r}"))
    elif isinstance(tool_type, str) and not executor:
        issues.append(Issue("$.executor", f"tool type {tool_type!r} requires an executor "
                                          "(the tool_id of the tool that runs it)"))
    elif executor is not None and executor_name(executor) == tool_id:
        issues.append(Issue("$.executor", "a tool cannot be its own executor"))
    if tool_type == "primitive" and isinstance(tool_id, str) and tool_id not in PRIMITIVES:
        issues.append(Issue("$.tool_id", f"primitive {tool_id!r} is not one of "
                                         f"{', '.join(sorted(PRIMITIVES))}"))
    return issues


def _executor_range_issues(executor: Any) -> list[Issue]:
    if not isinstance(executor, str) or "@" not in executor:
        return []
    range_text = executor.partition("@")[2].strip()
    try:
        parse_range(range_text)
    except RequestError as error:
        return [Issue("$.executor", f"executor version range {range_text!r} is invalid: "
                                    f"{error.message}")]
    return []


# ----------------------------------------------------------------------------- layer 2


@dataclass(frozen=True, slots=True)
class _Context:
    manifest: Mapping[str, Any]
    config: Mapping[str, Any]
    files: tuple[ToolFile, ...]
    bash_syntax: BashSyntax | None
    known_tools: Mapping[str, str]

    @property
    def executor(self) -> str | None:
        """The executor's tool_id, without any version range."""
        return executor_name(self.manifest.get("executor"))

    @property
    def file_paths(self) -> set[str]:
        return {f.path for f in self.files}


def _executor_type_issues(context: _Context, expected: str, fallback: Callable[[str], bool],
                          what: str) -> list[Issue]:
    """The executor must be a tool of type `expected`: checked against known_tools when
    they know it, else with the `fallback` naming rule."""
    executor = context.executor
    if executor is None:
        return []
    known = context.known_tools.get(executor)
    if known is not None:
        ok, got = known == expected, f"{executor!r} is {_article(known)} {known}"
    else:
        ok, got = fallback(executor), f"got {executor!r}"
    return [] if ok else [Issue("$.executor", f"{what} must use {_article(expected)} "
                                              f"{expected} as executor; {got}")]


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _primitive_executor_issues(context: _Context, allowed: Iterable[str], what: str) -> list[Issue]:
    executor = context.executor
    allowed = tuple(sorted(allowed))
    if executor is None or executor in allowed:
        return []
    return [Issue("$.executor", f"{what} must use executor {' or '.join(allowed)}, "
                                f"got {executor!r}")]


def _required_text(config: Mapping[str, Any], key: str, message: str) -> list[Issue]:
    value = config.get(key)
    if isinstance(value, str) and value.strip():
        return []
    return [Issue(f"$.config.{key}", message if value is None
                  else f"config.{key} must be a non-empty string")]


# --- output (every type)

TEXT_OUTPUT_TYPES: frozenset[str] = frozenset({"script", "api"})


def _output_issues(manifest: Mapping[str, Any]) -> list[Issue]:
    """`output: {format: text}` suits tools whose stdout (or HTTP body) is the result:
    script and API tools. Their result is then a string, so a result_schema must
    accept one."""
    output = manifest.get("output")
    if not isinstance(output, Mapping) or output.get("format") != "text":
        return []
    tool_type = manifest.get("tool_type")
    if tool_type not in TEXT_OUTPUT_TYPES:
        return [Issue("$.output.format", f"text output applies to script and api tools, "
                                         f"not to {tool_type!r} tools")]
    schema = manifest.get("result_schema")
    if isinstance(schema, Mapping) and not _accepts_a_string(schema):
        return [Issue("$.result_schema", "with output format text the result is a string; "
                                         "the result_schema must accept one "
                                         "(type: string)")]
    return []


def _accepts_a_string(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    if kind is None:
        return True
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


# --- script


def _check_script(context: _Context) -> list[Issue]:
    issues: list[Issue] = []
    if not context.files:
        issues.append(Issue("$.files", "script tools need at least one file"))
    issues.extend(_entrypoint_issues(context))
    for file in context.files:
        issues.extend(_syntax_issues(file, context.bash_syntax))
    issues.extend(_executor_type_issues(context, "runtime", lambda e: e.endswith("_runtime"),
                                        "script tools"))
    return issues


def _entrypoint_issues(context: _Context) -> list[Issue]:
    details = context.manifest.get("manifest")
    declared = {"$.config.entrypoint": context.config.get("entrypoint")}
    if isinstance(details, Mapping):
        declared["$.manifest.entrypoint"] = details.get("entrypoint")
    declared = {path: value for path, value in declared.items() if value is not None}
    if not declared:
        return [Issue("$.config.entrypoint", "script tools must specify config.entrypoint "
                                             "(or manifest.entrypoint)")]
    issues = [issue for path, value in declared.items()
              for issue in _one_entrypoint(path, value, context)]
    if len(set(map(str, declared.values()))) > 1:
        issues.append(Issue("$.manifest.entrypoint", "manifest.entrypoint and "
                                                     "config.entrypoint disagree"))
    return issues


def _one_entrypoint(path: str, value: Any, context: _Context) -> list[Issue]:
    if not isinstance(value, str) or not value.strip():
        return [Issue(path, "entrypoint must be a non-empty relative file path")]
    parts = relative_parts(value)
    if parts is None:
        return [Issue(path, f"entrypoint {value!r} must be a relative path inside the tool")]
    if "/".join(parts) not in context.file_paths:
        return [Issue(path, f"entrypoint {value!r} is not among the tool's files")]
    return []


def _syntax_issues(file: ToolFile, bash_syntax: BashSyntax | None) -> list[Issue]:
    if file.content is None:
        return []
    if file.path.endswith(".py"):
        return _python_syntax_issues(file.path, file.content)
    if bash_syntax is not None and _is_bash(file):
        error = bash_syntax(file.content.decode("utf-8", errors="replace"))
        return [Issue(_file_path(file.path), f"Bash syntax error: {error}")] if error else []
    return []


def _is_bash(file: ToolFile) -> bool:
    if file.path.endswith((".sh", ".bash")):
        return True
    first_line = (file.content or b"").split(b"\n", 1)[0]
    return first_line.startswith(b"#!") and (b"bash" in first_line or first_line.endswith(b"/sh"))


def _python_syntax_issues(path: str, content: bytes) -> list[Issue]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            compile(content, path, "exec", dont_inherit=True)
        except SyntaxError as error:
            return [Issue(_file_path(path), f"Python syntax error at line {error.lineno}: "
                                            f"{error.msg}")]
        except ValueError as error:
            return [Issue(_file_path(path), f"Python source cannot be compiled: {error}")]
    return [Issue(_file_path(path), f"Python warning at line {w.lineno}: {w.message}", "warning")
            for w in caught if w.filename == path
            and issubclass(w.category, SyntaxWarning | DeprecationWarning)]


# --- api


def _check_api(context: _Context) -> list[Issue]:
    issues = _primitive_executor_issues(context, ["http_client"], "API tools")
    issues.extend(_method_issues(context.config))
    url, template = context.config.get("url"), context.config.get("url_template")
    if url is None and template is None:
        issues.append(Issue("$.config.url_template",
                            "API tools must specify config.url_template or config.url"))
    if url is not None:
        issues.extend(_http_url_issues("$.config.url", url))
    if template is not None:
        issues.extend(_http_url_issues("$.config.url_template", template))
        issues.extend(_template_variable_issues(template, context.manifest.get("parameters")))
    if context.files:
        issues.append(Issue("$.files", "API tools are pure configuration; their files are "
                                       "not used", "warning"))
    return issues


def _method_issues(config: Mapping[str, Any]) -> list[Issue]:
    method = config.get("method")
    if method is None:
        return [Issue("$.config.method", "API tools must specify config.method, one of "
                                         f"{', '.join(HTTP_METHODS)}")]
    if method not in HTTP_METHODS:
        return [Issue("$.config.method", f"invalid HTTP method {method!r}; expected one of "
                                         f"{', '.join(HTTP_METHODS)}")]
    return []


def _http_url_issues(path: str, url: Any, schemes: tuple[str, ...] = ("http", "https")) -> list[Issue]:
    if not isinstance(url, str) or not url.strip():
        return [Issue(path, "URL must be a non-empty string")]
    try:
        parts = urlsplit(_TEMPLATE_VARIABLE.sub("x", url))
    except ValueError as error:
        return [Issue(path, f"URL {url!r} cannot be parsed: {error}")]
    if parts.scheme not in schemes:
        return [Issue(path, f"URL {url!r} must use {' or '.join(schemes)}")]
    if not parts.netloc:
        return [Issue(path, f"URL {url!r} has no host")]
    return []


def _template_variable_issues(template: Any, parameters: Any) -> list[Issue]:
    if not isinstance(template, str):
        return []
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    declared = set(properties) if isinstance(properties, Mapping) else set()
    issues: list[Issue] = []
    for name in dict.fromkeys(_TEMPLATE_VARIABLE.findall(template)):
        if not name:
            issues.append(Issue("$.config.url_template", "empty template variable {}"))
        elif name not in declared:
            issues.append(Issue("$.config.url_template",
                                f"template variable {{{name}}} is not a declared parameter "
                                "(add it to parameters.properties)"))
    return issues


# --- mcp


def _check_mcp_tool(context: _Context) -> list[Issue]:
    issues = _required_text(context.config, "mcp_tool_name",
                            "MCP tools must specify config.mcp_tool_name")
    issues.extend(_executor_type_issues(context, "mcp_server", lambda _: True, "MCP tools"))
    return issues


def _check_mcp_server(context: _Context) -> list[Issue]:
    issues = _primitive_executor_issues(context, PRIMITIVES, "MCP servers")
    config = context.config
    transport = config.get("transport")
    if transport is None:
        issues.append(Issue("$.config.transport", "MCP servers must specify config.transport, "
                                                  f"one of {', '.join(MCP_TRANSPORTS)}"))
    elif transport == "stdio":
        issues.extend(_required_text(config, "command", "stdio transport requires config.command"))
        issues.extend(_args_issues(config.get("args")))
    elif transport in MCP_TRANSPORTS:
        schemes = ("ws", "wss", "http", "https") if transport == "websocket" else ("http", "https")
        if config.get("url") is None:
            issues.append(Issue("$.config.url", f"{transport} transport requires config.url"))
        else:
            issues.extend(_http_url_issues("$.config.url", config["url"], schemes))
    else:
        issues.append(Issue("$.config.transport", f"invalid transport {transport!r}; expected "
                                                  f"one of {', '.join(MCP_TRANSPORTS)}"))
    if transport in MCP_TRANSPORTS and context.executor in PRIMITIVES:
        wanted = "subprocess" if transport == "stdio" else "http_client"
        if context.executor != wanted:
            issues.append(Issue("$.executor", f"{transport} MCP servers are reached through "
                                              f"{wanted}, not {context.executor}"))
    startup = config.get("startup_timeout")
    if startup is not None and (isinstance(startup, bool) or not isinstance(startup, int | float)
                                or startup <= 0):
        issues.append(Issue("$.config.startup_timeout",
                            "config.startup_timeout must be a positive number of seconds"))
    return issues


def _args_issues(args: Any) -> list[Issue]:
    if args is None:
        return []
    if not isinstance(args, list):
        return [Issue("$.config.args", "config.args must be a list of strings")]
    return [Issue(f"$.config.args[{index}]", f"argument {arg!r} must be a string")
            for index, arg in enumerate(args) if not isinstance(arg, str)]


# --- runtime, knowledge, directive


def _check_runtime(context: _Context) -> list[Issue]:
    issues = _primitive_executor_issues(context, PRIMITIVES, "runtimes")
    if context.config.get("command") is None and context.config.get("url") is None:
        issues.append(Issue("$.config.command", "runtimes must specify config.command "
                                                "or config.url"))
    return issues


def _check_knowledge(context: _Context) -> list[Issue]:
    markdown = [f for f in context.files if f.path.lower().endswith(".md")]
    if not markdown:
        return [Issue("$.files", "knowledge entries need a markdown (.md) file")]
    return [issue for file in markdown for issue in _frontmatter_issues(file)]


def _frontmatter_issues(file: ToolFile) -> list[Issue]:
    if file.content is None:
        return []
    path = _file_path(file.path)
    frontmatter, _ = split_frontmatter(file.content.decode("utf-8", errors="replace"))
    if frontmatter is None:
        return [Issue(path, "markdown has no YAML frontmatter (a block between '---' lines "
                            "at the top)")]
    try:
        data = load_yaml(frontmatter)
    except YamlTooLarge as error:
        return [Issue(path, f"YAML frontmatter refused: {error.message}")]
    except yaml.YAMLError as error:
        return [Issue(path, f"YAML frontmatter does not parse: {error}")]
    if not isinstance(data, Mapping):
        return [Issue(path, "YAML frontmatter must be a mapping of keys to values")]
    return []


def _check_directive(context: _Context) -> list[Issue]:
    return [] if context.files else [Issue("$.files", "directives need at least one file")]


def _check_primitive(context: _Context) -> list[Issue]:
    return []


_TYPE_CHECKS: dict[str, Callable[[_Context], list[Issue]]] = {
    "primitive": _check_primitive,
    "runtime": _check_runtime,
    "script": _check_script,
    "api": _check_api,
    "mcp_server": _check_mcp_server,
    "mcp_tool": _check_mcp_tool,
    "knowledge": _check_knowledge,
    "directive": _check_directive,
}
