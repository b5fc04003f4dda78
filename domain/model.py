"""Core value types shared across the domain: tools as data, and primitive plans."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

PRIMITIVES: frozenset[str] = frozenset({"subprocess", "http_client"})

TOOL_TYPES: tuple[str, ...] = (
    "primitive",
    "runtime",
    "script",
    "api",
    "mcp_server",
    "mcp_tool",
    "knowledge",
    "directive",
)

LIFECYCLE_STATES: tuple[str, ...] = ("active", "deprecated", "sunset", "removed")

MAX_CHAIN_DEPTH = 16
LOCAL_REGISTRY_URL = "urn:toolexec:local"
"""The registry a lockfile records when its chain was resolved from local sources."""


@dataclass(frozen=True, slots=True)
class ToolFile:
    """One file of a tool version. `path` is POSIX and relative to the tool root;
    `sha256` is the lowercase hex digest of `content`. `content` is present when the
    bytes are at hand (sources) and None in hash-only views. The registry view keeps
    published files compressed instead: `packed` (gzip) and `size` (uncompressed
    bytes, checked when the publication was folded), inflated only when a run needs
    the file (`domain.publication_limits.packed_content`)."""

    path: str
    sha256: str
    is_executable: bool = False
    content: bytes | None = None
    packed: bytes | None = None
    size: int | None = None


@dataclass(frozen=True, slots=True)
class Issue:
    """One validation finding: a JSON path into the manifest or file tree and a message."""

    path: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message, "severity": self.severity}


@dataclass(frozen=True, slots=True)
class ToolSource:
    """A tool as found on disk, before publishing: normalised manifest plus files.

    `layout` tells how it was stored: a directory with tool.yaml, a single YAML
    file, or a legacy Python file with dunder metadata.
    """

    manifest: Mapping[str, Any]
    files: tuple[ToolFile, ...] = ()
    origin: str = ""
    layout: Literal["directory", "single_file", "legacy_python", "builtin"] = "directory"


@dataclass(frozen=True, slots=True)
class PublisherSignature:
    """A publisher's Ed25519 signature over a version's integrity and the key id that
    names its public key (`domain.publisher_signature`)."""

    key_id: str
    signature: str


@dataclass(frozen=True, slots=True)
class ExecutorPin:
    """The exact executor version (and its integrity) a tool version runs on, fixed
    when the tool version was published."""

    tool_id: str
    version: str
    integrity: str

    def __str__(self) -> str:
        return f"{self.tool_id}@{self.version}"


@dataclass(frozen=True, slots=True)
class ToolVersion:
    """An immutable published tool version as the registry view knows it.

    `executor_pin` is the executor version it was published with; None for primitives,
    for sources not published yet, and for versions published before pins existed
    (their executor is resolved by range)."""

    tool_id: str
    version: str
    manifest: Mapping[str, Any]
    files: tuple[ToolFile, ...]
    integrity: str
    lifecycle: str = "active"
    lifecycle_reason: str | None = None
    replacement_tool_id: str | None = None
    executor_pin: ExecutorPin | None = None
    publisher_signature: PublisherSignature | None = None

    @property
    def tool_type(self) -> str:
        return str(self.manifest.get("tool_type", ""))

    @property
    def executor(self) -> str | None:
        value = self.manifest.get("executor")
        return str(value) if value else None


@dataclass(frozen=True, slots=True)
class ResolvedChain:
    """A chain ordered leaf -> primitive, plus warnings met on the way
    (deprecated versions, parents without child schemas in lenient mode)."""

    links: tuple[ToolVersion, ...]
    warnings: tuple[str, ...] = ()

    @property
    def leaf(self) -> ToolVersion:
        return self.links[0]

    @property
    def primitive(self) -> ToolVersion:
        return self.links[-1]


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Limits applied to a subprocess as rlimits. None means 'not limited'."""

    memory_bytes: int | None = 512 * 1024 * 1024
    cpu_seconds: int | None = None
    max_open_files: int | None = 256
    max_file_bytes: int | None = 1024 * 1024 * 1024
    max_processes: int | None = None
    stdout_max_bytes: int = 1024 * 1024
    stderr_max_bytes: int = 1024 * 1024


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """Egress allowed to a tool. Empty `allowed_domains` with deny_all_egress False
    means 'unrestricted' for http_client plans of API tools."""

    allowed_domains: tuple[str, ...] = ()
    allowed_ports: tuple[int, ...] = (80, 443)
    deny_all_egress: bool = False


@dataclass(frozen=True, slots=True)
class SubprocessPlan:
    """What the subprocess primitive runs: argv (never a shell string), the complete
    environment (nothing inherited), a working directory relative to the materialised
    tool root ('.' = root), the files to materialise, and limits."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "."
    timeout_seconds: float = 30.0
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    files: tuple[ToolFile, ...] = ()
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    kind: Literal["subprocess"] = "subprocess"


@dataclass(frozen=True, slots=True)
class HttpPlan:
    """What the http_client primitive sends. `url_template` placeholders `{name}` are
    filled from parameters at execution time with URL encoding; header values may hold
    `${ENV}` secret references, resolved at execution time and never stored."""

    method: str
    url_template: str
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    body_from_params: bool = False
    timeout_seconds: float = 30.0
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    retry_on_status_codes: tuple[int, ...] = (429, 500, 502, 503, 504)
    kind: Literal["http"] = "http"


@dataclass(frozen=True, slots=True)
class McpPlan:
    """A `tools/call` of one MCP tool on a long-lived MCP server.

    `server_key` names the server process or connection (tool id, version and
    integrity of the `mcp_server` link), so every call to the same verified server
    reuses it. A stdio server is started from `server` (a SubprocessPlan: argv, env,
    files, limits, sandbox as for any process); a remote one (`sse`,
    `streamable_http`) is reached at `endpoint` (an HttpPlan: url, `${ENV}` headers,
    network policy). `timeout_seconds` bounds one call, `startup_timeout_seconds`
    the server's start and MCP handshake. `definition_hash`, when set, is the hash
    the tool's announced definition must still have on the connection the call uses
    (checked before the call by the execute step, see domain.definitions)."""

    server_key: str
    tool_name: str
    transport: Literal["stdio", "sse", "streamable_http"]
    server: SubprocessPlan | None = None
    endpoint: HttpPlan | None = None
    timeout_seconds: float = 30.0
    startup_timeout_seconds: float = 10.0
    definition_hash: str | None = None
    kind: Literal["mcp"] = "mcp"

    @property
    def primitive(self) -> Literal["subprocess", "http_client"]:
        return "subprocess" if self.server is not None else "http_client"


Plan = SubprocessPlan | HttpPlan | McpPlan


@dataclass(frozen=True, slots=True)
class PrimitiveOutcome:
    """What a primitive observed. `error` is set when the run failed (timeout, OOM,
    non-zero exit, network policy...), as a dict `{code, message, details}`.

    For subprocess: `exit_code`, `stdout`/`stderr` (capped; `*_truncated` tells).
    For http: `status_code`, `stdout` holds the response body, `headers` the response
    headers (lower-cased names).
    """

    ok: bool
    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int | None = None
    status_code: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0
    error: Mapping[str, Any] | None = None
    sandbox: str = "none"
