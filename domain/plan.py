"""From a resolved chain to the primitive's plan.

Configs merge down the chain, primitive first: a child overrides its parent, mappings
merge key by key, and `args` concatenate parent-first. A link's own contribution to
`args` is `base_args + [entrypoint] + args`, so python_runtime's `base_args: ["-u"]`
and a script's `entrypoint: process_data.py` give `["-u", "process_data.py"]`.

The execution sections of Appendix C (`resource_limits`, `network_policy`,
`retry_policy`) merge the same way, read from the manifest top level or from `config`.
Values such as `${API_KEY}` are kept verbatim: the primitive resolves them at execution
time, so secrets never reach a plan or an event.

What executes is decided by the links that run it, not by the tool on top: a child
may not change `command`, `base_args` or an `env` variable that one of its parents
set (a script cannot swap python_runtime's interpreter for another program, nor
reset an interpreter option or a variable the runtime relies on) unless its
parent's matching child schema names that key under `properties.config.properties`
— an explicit "children may set this". Anything else a child adds or overrides
(its own variables, `args` after its entrypoint, `timeout`, limits that the
operator's ceilings bound anyway) stays its own. A refused override is E3105.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from domain.child_validation import child_document
from domain.errors import ChainInvalid
from domain.model import (
    HttpPlan,
    McpPlan,
    NetworkPolicy,
    ResolvedChain,
    ResourceLimits,
    SubprocessPlan,
    ToolFile,
    ToolVersion,
)
from domain.paths import relative_parts
from domain.quantities import parse_cpu, parse_size

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MCP_STARTUP_SECONDS = 10.0
MCP_CALLABLE_TRANSPORTS: tuple[str, ...] = ("stdio", "sse", "streamable_http")
EXECUTION_SECTIONS: tuple[str, ...] = ("resource_limits", "network_policy", "retry_policy")
_NO_BODY_METHODS = frozenset({"GET", "HEAD"})
_ENV_NAME = re.compile(r"[^=\x00\n]+")
"""Matched whole (`fullmatch`): `$` would also accept a name ending in a newline."""
EXECUTION_KEYS: tuple[str, ...] = ("command", "base_args", "env")
"""Config keys that decide what a subprocess runs: a child may not change what a
parent set there unless the parent's child schema allows it."""


def merged_config(chain: ResolvedChain) -> dict[str, Any]:
    """The chain's config merged primitive-first, each child overriding its parent."""
    merged: dict[str, Any] = {}
    for tv in reversed(chain.links):
        merged = _merge(merged, _contribution(tv), top=True)
    return merged


def merged_section(chain: ResolvedChain, name: str) -> dict[str, Any]:
    """An execution section (e.g. `resource_limits`) merged down the chain; each link's
    top-level value is overridden by the same section inside its `config`."""
    merged: dict[str, Any] = {}
    for tv in reversed(chain.links):
        config = _mapping(tv.manifest.get("config"))
        part = _merge(_mapping(tv.manifest.get(name)), _mapping(config.get(name)))
        merged = _merge(merged, part)
    return merged


def build_plan(chain: ResolvedChain, *,
               base_env: Mapping[str, str] | None = None) -> SubprocessPlan | HttpPlan | McpPlan:
    """The plan of the chain's primitive: a SubprocessPlan for `subprocess`, an HttpPlan
    for `http_client`, an McpPlan when the leaf is an `mcp_tool` (its server's plan
    inside). Raises ChainInvalid (E3105) on config the primitive cannot run."""
    if chain.leaf.tool_type == "mcp_tool":
        return _mcp_plan(chain, base_env or {})
    if chain.leaf.tool_type == "mcp_server":
        raise _invalid(f"{chain.leaf.tool_id} is an MCP server: invoke one of its mcp_tools")
    primitive = chain.primitive.tool_id
    config = merged_config(chain)
    if primitive == "subprocess":
        return _subprocess_plan(chain, config, base_env or {})
    if primitive == "http_client":
        return _http_plan(chain, config)
    raise ChainInvalid(f"no plan for primitive {primitive!r}", details={"tool_id": primitive})


def timeout_seconds(chain: ResolvedChain) -> float:
    """The nearest-to-leaf `config.timeout` or `timeout_default`, else 30 seconds."""
    for tv in chain.links:
        timeout = manifest_timeout(tv.manifest, tv.tool_id)
        if timeout is not None:
            return timeout
    return DEFAULT_TIMEOUT_SECONDS


def manifest_timeout(manifest: Mapping[str, Any], tool_id: str = "") -> float | None:
    """One manifest's attempt timeout: `config.timeout`, else `timeout_default`, else
    None. Raises ChainInvalid (E3105) for a value that is not a positive number."""
    config = _mapping(manifest.get("config"))
    for where, value in (("config.timeout", config.get("timeout")),
                         ("timeout_default", manifest.get("timeout_default"))):
        if value is not None:
            return _positive_number(value, f"{tool_id}: {where}")
    return None


# ------------------------------------------------------------------------------- mcp


def mcp_server_key(server: ToolVersion) -> str:
    """Identity of a running MCP server: the verified version it was started from."""
    return f"{server.tool_id}@{server.version}#{server.integrity}"


def _mcp_plan(chain: ResolvedChain, base_env: Mapping[str, str]) -> McpPlan:
    """An mcp_tool's chain is [mcp_tool, mcp_server, primitive]: the server's own chain
    gives its process or endpoint (the tool's config never reaches the server, which is
    shared by all its tools); the tool gives the name to call and the call's timeout."""
    if len(chain.links) != 3 or chain.links[1].tool_type != "mcp_server":
        raise _invalid(f"{chain.leaf.tool_id}: an mcp_tool's executor must be an mcp_server "
                       "run by a primitive")
    tool, server = chain.links[0], chain.links[1]
    tool_name = _mapping(tool.manifest.get("config")).get("mcp_tool_name")
    if not isinstance(tool_name, str) or not tool_name:
        raise _invalid(f"{tool.tool_id}: config.mcp_tool_name must name the server's tool")
    server_chain = ResolvedChain(chain.links[1:])
    config = merged_config(server_chain)
    transport = config.get("transport")
    if transport not in MCP_CALLABLE_TRANSPORTS:
        raise _invalid(f"{server.tool_id}: MCP transport {transport!r} cannot be called here; "
                       f"use one of {', '.join(MCP_CALLABLE_TRANSPORTS)}")
    startup = config.get("startup_timeout", DEFAULT_MCP_STARTUP_SECONDS)
    common = dict(server_key=mcp_server_key(server), tool_name=tool_name,
                  timeout_seconds=timeout_seconds(chain),
                  startup_timeout_seconds=_positive_number(startup,
                                                           f"{server.tool_id}: startup_timeout"))
    if transport == "stdio":
        if chain.primitive.tool_id != "subprocess":
            raise _invalid(f"{server.tool_id}: stdio MCP servers run under subprocess")
        process = _subprocess_plan(server_chain, config, base_env)
        return McpPlan(transport="stdio", server=process, **common)
    if chain.primitive.tool_id != "http_client":
        raise _invalid(f"{server.tool_id}: {transport} MCP servers are reached by http_client")
    url = config.get("url")
    if not isinstance(url, str) or not url:
        raise _invalid(f"{server.tool_id}: {transport} transport requires config.url")
    endpoint = HttpPlan(method="POST", url_template=url,
                        headers=_string_map(config.get("headers"), "config.headers"),
                        timeout_seconds=common["timeout_seconds"],
                        network=_network(merged_section(server_chain, "network_policy")))
    return McpPlan(transport=transport, endpoint=endpoint, **common)


# ------------------------------------------------------------------------ subprocess


def _subprocess_plan(chain: ResolvedChain, config: Mapping[str, Any],
                     base_env: Mapping[str, str]) -> SubprocessPlan:
    check_overrides(chain)
    command = config.get("command")
    if not isinstance(command, str) or not command:
        raise _invalid(f"chain of {chain.leaf.tool_id} declares no config.command for subprocess")
    args = config.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _invalid("config.args must be a list of strings")
    timeout = timeout_seconds(chain)
    return SubprocessPlan(
        argv=(command, *args),
        env={**base_env, **_string_map(config.get("env"), "config.env", env=True)},
        cwd=_relative_path(config.get("cwd", "."), "config.cwd"),
        timeout_seconds=timeout,
        limits=_limits(merged_section(chain, "resource_limits"), timeout),
        files=_files(chain.links[:-1]),
        network=_network(merged_section(chain, "network_policy")),
    )


def _limits(section: Mapping[str, Any], timeout: float) -> ResourceLimits:
    defaults = ResourceLimits()
    cpu = section.get("cpu")
    return ResourceLimits(
        memory_bytes=(parse_size(section["memory"], "resource_limits.memory")
                      if "memory" in section else defaults.memory_bytes),
        cpu_seconds=(math.ceil(timeout * parse_cpu(cpu, "resource_limits.cpu"))
                     if cpu is not None else defaults.cpu_seconds),
        max_file_bytes=(parse_size(section["ephemeral_storage"], "resource_limits.ephemeral_storage")
                        if "ephemeral_storage" in section else defaults.max_file_bytes),
        max_open_files=_count(section, "max_open_files", defaults.max_open_files),
        max_processes=_count(section, "max_processes", defaults.max_processes),
        stdout_max_bytes=_count(section, "stdout_max_bytes", defaults.stdout_max_bytes) or 0,
        stderr_max_bytes=_count(section, "stderr_max_bytes", defaults.stderr_max_bytes) or 0,
    )


def _files(links: Sequence[ToolVersion]) -> tuple[ToolFile, ...]:
    """Files of every non-primitive link; a child's file shadows a parent's same path."""
    by_path: dict[str, ToolFile] = {}
    for tv in reversed(links):
        for file in tv.files:
            by_path[file.path] = file
    return tuple(by_path[path] for path in sorted(by_path))


# ------------------------------------------------------------------------------ http


def _http_plan(chain: ResolvedChain, config: Mapping[str, Any]) -> HttpPlan:
    method = str(config.get("method", "GET")).upper()
    url = config.get("url_template") or config.get("url")
    if not isinstance(url, str) or not url:
        raise _invalid(f"chain of {chain.leaf.tool_id} declares no config.url_template or "
                       "config.url for http_client")
    body = config.get("body_from_params", method not in _NO_BODY_METHODS)
    codes = merged_section(chain, "retry_policy").get("retry_on_status_codes")
    retry = {} if codes is None else {"retry_on_status_codes": _status_codes(codes)}
    return HttpPlan(
        method=method,
        url_template=url,
        headers=_string_map(config.get("headers"), "config.headers"),
        query=_string_map(config.get("query"), "config.query"),
        body_from_params=bool(body),
        timeout_seconds=timeout_seconds(chain),
        network=_network(merged_section(chain, "network_policy")),
        **retry,
    )


def _status_codes(codes: Any) -> tuple[int, ...]:
    if not isinstance(codes, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 100 <= c <= 599 for c in codes):
        raise _invalid("retry_policy.retry_on_status_codes must be a list of HTTP status codes")
    return tuple(codes)


# ------------------------------------------------------------------------- sections


def _network(section: Mapping[str, Any]) -> NetworkPolicy:
    defaults = NetworkPolicy()
    domains = section.get("allowed_domains", list(defaults.allowed_domains))
    ports = section.get("allowed_ports", list(defaults.allowed_ports))
    deny = section.get("deny_all_egress", defaults.deny_all_egress)
    if not isinstance(domains, list) or not all(isinstance(d, str) and d for d in domains):
        raise _invalid("network_policy.allowed_domains must be a list of host names")
    if not isinstance(ports, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports):
        raise _invalid("network_policy.allowed_ports must be a list of ports (1-65535)")
    if not isinstance(deny, bool):
        raise _invalid("network_policy.deny_all_egress must be true or false")
    return NetworkPolicy(allowed_domains=tuple(domains), allowed_ports=tuple(ports),
                         deny_all_egress=deny)


# ------------------------------------------------------------------------ overrides


def check_overrides(chain: ResolvedChain) -> None:
    """Raise ChainInvalid (E3105) when a link changes an execution key (EXECUTION_KEYS)
    that a link below it set, without its parent's child schema allowing it."""
    links = chain.links
    for index in range(len(links) - 1):
        child, parent = links[index], links[index + 1]
        config = _mapping(child.manifest.get("config"))
        touched = [key for key in EXECUTION_KEYS if key in config]
        if not touched:
            continue
        allowed = allowed_config_keys(parent, child)
        below = [_mapping(tv.manifest.get("config")) for tv in links[index + 1:]]
        for key in touched:
            if key in allowed:
                continue
            if key == "env":
                inherited = {name for c in below for name in _mapping(c.get("env"))}
                changed = sorted(name for name in _mapping(config.get("env")) if name in inherited)
                if changed:
                    raise _refused(child, parent, f"config.env.{changed[0]}")
            elif any(key in c for c in below):
                raise _refused(child, parent, f"config.{key}")


def allowed_config_keys(parent: ToolVersion, child: ToolVersion) -> frozenset[str]:
    """The config keys the parent's first matching child schema names (its
    `properties.config.properties`): the ones its children may set freely."""
    validation = _mapping(parent.manifest.get("validation"))
    entries = validation.get("child_schemas")
    if not isinstance(entries, list):
        return frozenset()
    document = child_document(child)
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        match = entry.get("match")
        if match is not None and not (isinstance(match, Mapping) and all(
                key in document and document[key] == value for key, value in match.items())):
            continue
        schema = _mapping(entry.get("schema"))
        config = _mapping(_mapping(schema.get("properties")).get("config"))
        return frozenset(_mapping(config.get("properties")))
    return frozenset()


def _refused(child: ToolVersion, parent: ToolVersion, key: str) -> ChainInvalid:
    message = (f"{child.tool_id}@{child.version} may not override {key} set by "
               f"{parent.tool_id}@{parent.version} or below it: what runs is decided by the "
               f"runtime, and {parent.tool_id}'s child schema does not let children set it")
    return ChainInvalid(message, details={"reason": message, "tool_id": child.tool_id,
                                          "key": key, "parent": parent.tool_id})


# --------------------------------------------------------------------------- merging


def _contribution(tv: ToolVersion) -> dict[str, Any]:
    """A link's config with `base_args`, entrypoint and `args` folded into `args`."""
    config = dict(_mapping(tv.manifest.get("config")))
    entrypoint = config.get("entrypoint") or _mapping(tv.manifest.get("manifest")).get("entrypoint")
    args: list[Any] = [*_list(config.pop("base_args", []), tv, "config.base_args")]
    if entrypoint is not None:
        args.append(_relative_path(entrypoint, f"{tv.tool_id}: entrypoint"))
        config["entrypoint"] = entrypoint
    args.extend(_list(config.get("args", []), tv, "config.args"))
    if args:
        config["args"] = args
    return config


def _merge(parent: Mapping[str, Any], child: Mapping[str, Any], *,
           top: bool = False) -> dict[str, Any]:
    merged = dict(parent)
    for key, value in child.items():
        old = merged.get(key)
        if top and key == "args" and isinstance(old, list) and isinstance(value, list):
            merged[key] = [*old, *value]
        elif isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = _merge(old, value)
        else:
            merged[key] = value
    return merged


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any, tv: ToolVersion, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _invalid(f"{tv.tool_id}@{tv.version}: {where} must be a list")
    return value


def _string_map(value: Any, where: str, *, env: bool = False) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _invalid(f"{where} must be a mapping of names to values")
    result: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or (env and not _ENV_NAME.fullmatch(key)):
            raise _invalid(f"{where} has an invalid name {key!r}")
        result[key] = _scalar_text(item, f"{where}.{key}")
    return result


def _scalar_text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise _invalid(f"{where} must be a string, number or boolean")


def _relative_path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise _invalid(f"{where} must be a non-empty path")
    if relative_parts(value, allow_root=True) is None:
        raise _invalid(f"{where} {value!r} must be relative to the tool root and stay inside it")
    return value


def _count(section: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = section.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _invalid(f"resource_limits.{key} must be a non-negative integer")
    return value


def _positive_number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _invalid(f"{where} must be a positive number of seconds, got {value!r}")
    return float(value)


def _invalid(message: str) -> ChainInvalid:
    return ChainInvalid(message, details={"reason": message})
