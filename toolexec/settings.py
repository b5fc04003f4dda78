"""The one `Settings` object of a toolexec process.

Built once at start (`Settings()` reads `TOOLEXEC_*` environment variables) and passed
down; nothing here connects, creates files or reads the environment at import time.

Two profiles (docs/architecture.md): with `kafka_bootstrap` unset the process runs
the embedded profile (Tansu child process, SQLite under `state_dir`); with it set, the
production profile (any Kafka, plus `database_url` / `redis_url`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from domain.credentials import CredentialGrants
from domain.errors import ChainInvalid
from domain.publication_limits import PublicationLimits
from domain.quantities import parse_size
from domain.sandbox_policy import SandboxPolicy
from projections.kafka_connection import kafka_ssl_context

if TYPE_CHECKING:
    from faststream.security import BaseSecurity

MIB = 1024 * 1024

SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
SSL_PROTOCOLS = ("SSL", "SASL_SSL")
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")

# Consumer-group tuning per profile. Tansu with aiokafka defaults takes 5-18 s per group
# join; these bring it to about a second. Apache Kafka refuses sessions below its
# `group.min.session.timeout.ms` (6000 by default), hence the production values.
# Tansu (embedded) does not answer a waiting fetch when records arrive, so straight to
# Tansu every hop costs up to fetch_max_wait_ms: kept short there while work is in
# flight (measured: 500 ms wait -> 249 ms p50 per hop, 5 ms -> 2.8 ms, 1 ms -> 0.8 ms)
# and long while idle (consumers.runtime.fetch_pacing). Its gate (toolexec.kafka_relay)
# answers a waiting fetch of 10 ms or more when a produce lands, as Kafka does: behind
# it (compactions on, the default) consumers that follow new records wait long, busy
# or idle, and are woken by them (`fetch_waits`). This profile wait stays 1 ms for
# readers that read a partition to its end (the pipeline's recovery): they learn they
# are there from an empty answer, and would wait out a long wait.
# A heartbeat every third of the session: a member that dies is noticed after the
# session timeout, as with any interval; the others learn of a rebalance within one
# interval (each heartbeat is a broker request, idle or not).
EMBEDDED_CONSUMER_TUNING: dict[str, int] = {
    "session_timeout_ms": 1000,
    "heartbeat_interval_ms": 333,
    "rebalance_timeout_ms": 1000,
    "fetch_max_wait_ms": 1,
}
PRODUCTION_CONSUMER_TUNING: dict[str, int] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 2000,
    "fetch_max_wait_ms": 100,
}


class Settings(BaseSettings):
    """Configuration of one toolexec process (env prefix `TOOLEXEC_`)."""

    model_config = SettingsConfigDict(env_prefix="TOOLEXEC_", extra="ignore")

    kafka_bootstrap: str | None = None
    """Kafka bootstrap servers; None runs the embedded Tansu broker."""
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = (
        "PLAINTEXT")
    """How every Kafka client of this process connects (docs/broker-security.md);
    anything but PLAINTEXT needs `kafka_bootstrap` (the embedded broker has no auth)."""
    kafka_sasl_mechanism: str = "SCRAM-SHA-512"
    """SASL mechanism with SASL_*: SCRAM-SHA-512 or SCRAM-SHA-256. PLAIN is refused (the
    password would cross the wire as it is, and Tansu refuses it)."""
    kafka_sasl_username: str | None = None
    """SASL principal name (required with SASL_*)."""
    kafka_sasl_password: SecretStr | None = None
    """SASL password; or `kafka_sasl_password_file` (one of the two with SASL_*)."""
    kafka_sasl_password_file: Path | None = None
    """File holding the SASL password (read each time a client is made; one trailing
    newline is dropped), e.g. a compose or Kubernetes secret."""
    kafka_ssl_cafile: Path | None = None
    """CA bundle the broker's certificate is checked against with SSL / SASL_SSL; None =
    the system's CAs."""
    database_url: str | None = None
    """SQLAlchemy URL of the projection store; None = SQLite under `state_dir`."""
    embeddings_url: str | None = None
    """OpenAI-compatible embeddings endpoint for semantic tool search (e.g.
    `http://127.0.0.1:8080/v1`; `/embeddings` is appended unless the URL ends with it).
    Used on PostgreSQL with pgvector only; None = full-text search alone."""
    embeddings_model: str = "text-embedding-3-small"
    """Model name sent to the embeddings endpoint (stored vectors are per model)."""
    embeddings_dimensions: int | None = Field(default=None, ge=1, le=16000)
    """Dimensions asked of the endpoint (`dimensions` in the request); None = its default."""
    embeddings_key_file: Path | None = None
    """File holding the endpoint's API key (sent as a bearer token); None = no key."""
    redis_url: str | None = None
    """Redis shared by every replica for the executor's idempotency claims and the
    authorize step's decision cache (e.g. `redis://host:6379/0`); None = SQLite claims
    under `state_dir` and an in-process decision cache."""
    state_dir: Path = Path(".toolexec")
    """Runtime state of the embedded profile: SQLite, caches, logs, runtime.json."""
    tools_dir: Path = Path(".ai/tools")
    """Project tools, published at start."""
    user_tools_dir: Path | None = Field(default_factory=lambda: Path.home() / ".ai" / "tools")
    """User-level tools; None disables them."""
    require_auth: bool | None = None
    """Require an RS256 capability token on every invocation; None = the profile
    default (off embedded, on in production)."""
    fact_signing_key: Path | None = None
    """PEM file of the Ed25519 key the pipeline signs its facts with; None = (embedded)
    `keys/facts.pem` under `state_dir`, made on first start."""
    fact_public_keys: list[Path] = Field(default_factory=list)
    """PEM files of Ed25519 public keys whose fact signatures are trusted (every
    pipeline's, old and new while rotating); the embedded key is always trusted."""
    token_seal_key: Path | None = None
    """PEM file of the pipeline's X25519 key that opens the capability tokens producers
    seal to it (contracts/token_seal.py); None = (embedded) `keys/token-seal.pem` under
    `state_dir`, made on first start; in production without it tokens are not sealed."""
    token_seal_public_key: Path | None = None
    """PEM file of the pipeline's X25519 public key, for producers that do not hold the
    private key: they seal the tokens they send to it. None = the embedded state
    directory's key, when there is one."""
    trusted_publishers: dict[str, list[str]] = Field(default_factory=dict)
    """The publisher trust store: tool id prefix ("" = every tool) -> the publisher keys
    trusted for it, each a key id (`ed25519:...`) or a PEM public key file, e.g.
    `TOOLEXEC_TRUSTED_PUBLISHERS='{"acme.": ["/keys/acme.pub"]}'` (docs/publishers.md)."""
    require_signatures: bool = False
    """Resolution refuses (E3107) a version whose tool id a trust store prefix matches
    unless a key trusted for it signed its integrity; off, signatures are only shown."""
    token_public_keys: list[Path] = Field(default_factory=list)
    """PEM or JWKS files of the RSA public keys accepted for capability tokens
    (several for rotation; read again on every verification)."""
    token_max_ttl_seconds: int = Field(default=24 * 3600, ge=1)
    """Longest lifetime (`exp - iat`) of a capability token that is accepted; longer
    ones are refused (E3203) and `toolexec token issue` will not sign them."""
    token_clock_skew_seconds: int = Field(default=60, ge=0)
    """How far in the future a token's `iat` / `nbf` may be (clocks differ a little)."""
    token: str | None = None
    """Capability token the CLI presents when a command gets no `--token` (write
    commands with authorization on, `run`)."""
    policy_default: Literal["allow", "deny"] = "allow"
    """Decision when no Cedar policy was ever applied (with policies, Cedar denies by
    default)."""
    abac_url: str | None = None
    """External ABAC engine (`POST {abac_url}/v1/authorize`) deciding instead of the
    in-process Cedar policies; unreachable -> E3205."""
    decision_cache_ttl_seconds: float = 300.0
    """How long a policy decision is reused for the same (subject, tool, version,
    policy version); every policy.updated clears the cache (in Redis too)."""
    approval_ttl_seconds: float = Field(default=3600.0, gt=0)
    """How long a call that needs approval waits for an approver before it fails with
    E3209 (the expiry is written in its `tool.approval.requested`)."""
    sandbox: Literal["auto", "namespaces", "bwrap", "landlock", "rlimits", "none"] | None = None
    """Subprocess sandbox; None = "auto": the namespace launcher when usable (root),
    else bubblewrap when installed, else Landlock when the kernel supports it, else
    (embedded) rlimits or (production) E3405 on every run. `rlimits` is the explicit
    opt-out; `namespaces` / `bwrap` / `landlock` force one sandbox."""
    strict_chain: bool = True
    """Fail resolution when a parent does not validate its child."""
    log_json: bool = False
    """Structured logs as JSON lines (production) instead of console rendering."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"

    session_timeout_ms: int | None = None
    """Consumer-group session timeout; None = the profile default (1000 / 6000)."""
    heartbeat_interval_ms: int | None = None
    """Consumer heartbeat interval; None = the profile default (333 / 2000)."""
    rebalance_timeout_ms: int | None = None
    """Consumer rebalance timeout; None = the profile default (1000 / client default)."""
    fetch_max_wait_ms: int | None = None
    """Longest a fetch waits for records while a consumer is busy; None = the profile
    default: 100 ms in production; embedded 1 ms (Tansu holds every fetch this long),
    and behind its gate, which wakes a waiting fetch when records arrive, 100 ms for
    the consumers that follow new records (`fetch_waits`)."""
    fetch_idle_wait_ms: int | None = None
    """Fetch wait of a consumer idle for a few seconds; None = the profile default
    (500 ms). Tansu answers a waiting fetch only halfway through or at its end: an idle
    consumer polls at this rate, and the first request after a pause may wait about
    half of it."""

    gateway_host: str = "127.0.0.1"
    """Address the HTTP gateway of `toolexec up` listens on (loopback by default)."""
    gateway_port: int = Field(default=0, ge=0, le=65535)
    """Port of the HTTP gateway; 0 = a free port (written to runtime.json)."""

    broker_archive_fsync: Literal["always", "never"] = "always"
    """Embedded profile: when archived records reach the disk. `always`: fsync before a
    record counts as archived (survives a machine stop); `never`: the OS writes them
    back (survives process crashes, not a power loss)."""
    broker_archive_fetch_wait_ms: int = Field(default=5, ge=1, le=1000)
    """Longest the archiver's fetch waits on the embedded broker while records flow:
    about the window of acknowledged records a broker killed with SIGKILL can take."""
    broker_archive_idle_wait_ms: int = Field(default=300, ge=1, le=5000)
    """The archiver's fetch wait once the log has been quiet for a few seconds: what
    its idle polling costs, and twice the window of the first records after a quiet
    spell (Tansu answers a waiting fetch at half its wait once records are there)."""
    broker_start_timeout_seconds: float = 120.0
    """How long a command waits for the embedded broker to be ready (its restore from
    the archive included)."""
    broker_crash_offset_gap: int = Field(default=10_000, ge=1)
    """After the embedded broker died, the log resumes this many offsets past the
    highest offset it may have handed out, so an offset lost with it is never reused."""
    broker_retain_records: int = Field(default=20_000, ge=0)
    """Embedded profile: records per partition of `broker_trim_topics` the broker keeps
    in memory when it (re)starts; older ones stay in the archive (read models read them
    there). 0 keeps everything in the broker."""
    broker_trim_topics: list[str] = Field(default_factory=lambda: [
        "toolexec.invocations", "toolexec.requests", "toolexec.deadletter"])
    """Topics whose oldest records may be left out of the embedded broker. The registry,
    policies and circuits topics are folded from their first record by every process:
    they stay whole."""
    broker_compact_after_records: int = Field(default=50_000, ge=0)
    """Records the embedded broker may take after it (re)started before it is restarted
    from the archive (retention applied, history in compressed batches) at the next
    quiet moment: what bounds its memory. 0 = never. Above 0 the broker serves through
    its gate from the cold start on (a compaction is exact only behind it)."""
    broker_compact_quiet_seconds: float = Field(default=5.0, ge=0)
    """How long nothing must have been written before that restart (it is forced, quiet
    or not, at four times `broker_compact_after_records`)."""
    projections_on_divergence: Literal["rebuild", "refuse"] = "rebuild"
    """A read model whose stored position does not match its log (past the end, or
    another record there): rebuild it from the log, or refuse to follow it. A read
    model of another cluster's log is always refused."""
    projections_verify_seconds: float = Field(default=5.0, gt=0)
    """How often a running read model checks that its log still holds the record it
    applied last."""

    registry_wait_seconds: float = 5.0
    """Read-your-writes bound: how long the resolver waits for the registry view."""
    read_your_writes_seconds: float = Field(default=5.0, ge=0)
    """Read-your-writes bound of readers outside `up` (`toolexec mcp`, `toolexec status`):
    how long they wait for `up`'s read models to fold the log up to its end as it was
    when asked, before answering what the read models hold (0: no wait)."""
    max_message_bytes: int = MIB
    """Largest record toolexec produces; bigger tool publications are rejected (E3105)."""
    max_tool_files: int = Field(default=1000, ge=1)
    """Most files one tool version may hold (publish, and every registry view)."""
    max_tool_bytes: int = Field(default=20 * MIB, ge=1)
    """Most uncompressed bytes one tool version's files may add up to; checked before
    anything is inflated, at publish and in every registry view."""
    max_parameter_bytes: int = Field(default=256 * 1024, ge=1)
    """Largest invocation parameters (compact JSON, UTF-8), from the gateway, the CLI
    or any Kafka producer (E3004; HTTP 413)."""
    gateway_max_body_bytes: int = Field(default=MIB, ge=1)
    """Largest HTTP request body the gateway reads (413 E3004 past it)..."""
    gateway_max_register_bytes: int = Field(default=32 * MIB, ge=1)
    """... except on `POST /v1/tools/register`, whose body carries a tool's files."""

    # --- Sandbox ceilings, egress and credential grants: operator rights, which a
    # manifest can only narrow (docs/sandbox.md). Sizes take "512Mi", "2Gi" or bytes.
    sandbox_max_memory: str = "2Gi"
    """Largest address space (RLIMIT_AS) of any tool process."""
    sandbox_max_cpu_seconds: int = Field(default=300, gt=0)
    """Most CPU seconds of any tool process; default limit: one core for the wall time."""
    sandbox_max_processes: int = Field(default=256, gt=0)
    """Processes (and threads) of one run, counted per run."""
    sandbox_max_disk: str = "1Gi"
    """What one run may write: its quota under bubblewrap, the largest file elsewhere."""
    sandbox_max_wall_seconds: float = Field(default=600.0, gt=0)
    """Longest a run (a tool process, an HTTP request, an MCP call) may take."""
    sandbox_uid_base: int = Field(default=200_000, ge=1000)
    """First of the uids given one per run when toolexec runs as root."""
    sandbox_uid_count: int = Field(default=1024, ge=1)
    """How many per-run uids (at least the runs at once, MCP servers included)."""
    egress_allowed_networks: list[str] = Field(default_factory=list)
    """CIDR blocks tools may reach although loopback, link-local or private (JSON list)."""
    credential_grants: dict[str, list[str]] = Field(default_factory=dict)
    """Credential name -> tool ids (or `prefix*`) that may receive it (JSON object)."""

    # --- Callbacks of async callers (docs/observability.md, "Async callers").
    callback_hosts: list[str] = Field(default_factory=list)
    """Hosts a request's `callback_url` may name (JSON list): exact names or addresses,
    or `*.example.com`; empty = callbacks refused (E3406). A private or loopback
    address is reached only through a host listed exactly."""
    callback_secret_file: Path | None = None
    """File holding the HMAC-SHA256 key that signs callbacks; None = `keys/callback.key`
    under the state directory, made on first use."""
    callback_max_attempts: int = Field(default=6, ge=1, le=50)
    """POSTs of one callback before it is given up (E3704), with exponential backoff."""
    callback_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    """How long one POST of a callback may take."""
    callback_first_backoff_seconds: float = Field(default=0.5, gt=0, le=60)
    """Wait before the second POST; each next wait doubles (with jitter, at most 60 s)."""

    @field_validator("sandbox_max_memory", "sandbox_max_disk")
    @classmethod
    def _size(cls, value: str) -> str:
        try:
            size = parse_size(value, "size")
        except ChainInvalid as error:
            raise ValueError(error.message) from None
        if size <= 0:
            raise ValueError("must be a positive size")
        return value

    @field_validator("egress_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value

    @field_validator("credential_grants")
    @classmethod
    def _grants(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        CredentialGrants.parse(value)
        return value

    def sandbox_policy(self) -> SandboxPolicy:
        """The operator's SandboxPolicy; the state directory is never shown to a tool."""
        return SandboxPolicy(
            max_memory_bytes=parse_size(self.sandbox_max_memory),
            max_cpu_seconds=self.sandbox_max_cpu_seconds,
            max_processes=self.sandbox_max_processes,
            max_disk_bytes=parse_size(self.sandbox_max_disk),
            max_wall_seconds=self.sandbox_max_wall_seconds,
            egress_allowed_networks=tuple(self.egress_allowed_networks),
            protected_paths=(str(Path(self.state_dir).resolve()),),
            run_uid_base=self.sandbox_uid_base, run_uid_count=self.sandbox_uid_count)

    def credential_grants_policy(self) -> CredentialGrants:
        """The operator's credential grants (nothing is granted by default)."""
        return CredentialGrants.parse(self.credential_grants)

    @field_validator("kafka_sasl_mechanism", mode="before")
    @classmethod
    def _mechanism(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        mechanism = value.strip().upper()
        if mechanism == "PLAIN":
            raise ValueError(
                "SASL PLAIN is refused: it sends the password as it is (and Tansu does not "
                "offer it); use SCRAM-SHA-512 (the default) or SCRAM-SHA-256")
        if mechanism not in SASL_MECHANISMS:
            raise ValueError(f"unsupported SASL mechanism {value!r}; use one of "
                             f"{', '.join(SASL_MECHANISMS)}")
        return mechanism

    @model_validator(mode="after")
    def _kafka_security(self) -> Settings:
        protocol = self.kafka_security_protocol
        sasl_given = [name for name in ("kafka_sasl_username", "kafka_sasl_password",
                                        "kafka_sasl_password_file")
                      if getattr(self, name) is not None]
        if protocol != "PLAINTEXT" and self.kafka_bootstrap is None:
            raise ValueError(
                f"kafka_security_protocol {protocol} needs kafka_bootstrap: the embedded "
                "broker takes PLAINTEXT loopback clients only")
        if protocol in SASL_PROTOCOLS:
            if not self.kafka_sasl_username:
                raise ValueError(f"kafka_security_protocol {protocol} needs "
                                 "kafka_sasl_username (TOOLEXEC_KAFKA_SASL_USERNAME)")
            if (self.kafka_sasl_password is None) == (self.kafka_sasl_password_file is None):
                raise ValueError(
                    f"kafka_security_protocol {protocol} needs exactly one of "
                    "kafka_sasl_password and kafka_sasl_password_file "
                    "(TOOLEXEC_KAFKA_SASL_PASSWORD / TOOLEXEC_KAFKA_SASL_PASSWORD_FILE)")
        elif sasl_given:
            raise ValueError(f"{', '.join(sasl_given)} set but kafka_security_protocol is "
                             f"{protocol}: the credentials would not be used; use "
                             "SASL_PLAINTEXT or SASL_SSL")
        if self.kafka_ssl_cafile is not None and protocol not in SSL_PROTOCOLS:
            raise ValueError(f"kafka_ssl_cafile set but kafka_security_protocol is {protocol} "
                             "(no TLS); use SSL or SASL_SSL")
        return self

    @field_validator("kafka_bootstrap", "database_url", "redis_url", "user_tools_dir",
                     "require_auth", "sandbox", "abac_url", "token", "fact_signing_key",
                     "token_seal_key", "token_seal_public_key",
                     "kafka_sasl_username", "kafka_sasl_password_file", "kafka_ssl_cafile",
                     "embeddings_url", "embeddings_key_file", "callback_secret_file",
                     mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        # `TOOLEXEC_KAFKA_BOOTSTRAP=` in a shell or compose file means "not set".
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @property
    def embedded(self) -> bool:
        """True when this process runs (or joins) the embedded profile."""
        return self.kafka_bootstrap is None

    @property
    def broker_gated_from_start(self) -> bool:
        """True when the embedded broker serves through its gate from its cold start on:
        with compactions on, since a compaction is exact only behind a gate (the
        supervisor decides so; clients read the same rule here)."""
        return self.broker_compact_after_records > 0

    @property
    def gate_wakes_fetches(self) -> bool:
        """True when clients reach the embedded broker through its gate from its cold
        start on, which answers a waiting fetch as soon as a produce lands through it:
        a consumer following new records need not poll."""
        return self.embedded and self.broker_gated_from_start

    @property
    def auth_required(self) -> bool:
        """`require_auth`, or the profile default."""
        return (not self.embedded) if self.require_auth is None else self.require_auth

    @property
    def effective_sandbox(self) -> str:
        """`sandbox`, or "auto"."""
        return self.sandbox if self.sandbox is not None else "auto"

    @property
    def sandbox_strict(self) -> bool:
        """Whether "auto" fails closed when no sandbox is available (production)."""
        return not self.embedded

    @property
    def publication_limits(self) -> PublicationLimits:
        """`max_tool_files` and `max_tool_bytes` as the domain's limits."""
        return PublicationLimits(max_files=self.max_tool_files, max_bytes=self.max_tool_bytes)

    @property
    def runtime_file(self) -> Path:
        """Where a running `toolexec up` advertises its endpoints."""
        return self.state_dir / "runtime.json"

    @property
    def effective_database_url(self) -> str:
        """`database_url`, or the embedded profile's SQLite file under `state_dir`."""
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.state_dir / 'toolexec.db').resolve()}"


IDLE_FETCH_WAIT_MS = 500
WOKEN_BUSY_WAIT_MS = 100
"""Busy wait of a consumer following new records behind the gate, which answers it
when a produce lands: the wait bounds only what the gate cannot see coming (a fetch
sent while its partitions were paused, records that reached Tansu another way)."""


def fetch_waits(settings: Settings) -> tuple[int, int]:
    """(busy, idle) fetch waits of a consumer that follows new records, paced by
    `consumers.runtime.fetch_pacing`, for `settings`' profile. Behind the embedded
    broker's gate it is woken by new records and need not poll while busy; a reader
    that reads a partition to its end keeps `consumer_kwargs`' wait."""
    busy = consumer_kwargs(settings)["fetch_max_wait_ms"]
    idle = max(settings.fetch_idle_wait_ms or IDLE_FETCH_WAIT_MS, busy)
    if settings.fetch_max_wait_ms is None and gate_wakes(settings):
        busy = min(WOKEN_BUSY_WAIT_MS, idle)  # in place of the profile's 1 ms poll
    return busy, idle


def gate_wakes(settings: Settings) -> bool:
    """Whether the broker `settings`' clients reach answers a waiting fetch as soon as
    a produce lands: the embedded broker behind its gate. A running supervisor's state
    file says how it serves (it may have been started with other settings: a client
    that waited for a wake-up straight to Tansu would wait out every fetch); before
    one runs, the rule it will follow (`gate_wakes_fetches`). A broker started straight
    to Tansu serves behind the gate after its first restart: its clients keep polling,
    which costs only the polls."""
    if not settings.embedded:
        return False
    from toolexec.broker_control import read_state, supervisor_running  # builds on this

    state = read_state(settings.state_dir)
    mode = state.data.get("mode") if state is not None and supervisor_running(state) else None
    if mode in ("gated", "direct"):
        return mode == "gated"
    return settings.gate_wakes_fetches


def consumer_kwargs(settings: Settings) -> dict[str, Any]:
    """aiokafka consumer tuning for `settings`' profile.

    The keys are accepted both by `aiokafka.AIOKafkaConsumer` and by FastStream's
    `KafkaBroker.subscriber`. Explicit settings override the profile defaults.
    """
    tuning: dict[str, Any] = dict(
        EMBEDDED_CONSUMER_TUNING if settings.embedded else PRODUCTION_CONSUMER_TUNING
    )
    overrides = {
        "session_timeout_ms": settings.session_timeout_ms,
        "heartbeat_interval_ms": settings.heartbeat_interval_ms,
        "rebalance_timeout_ms": settings.rebalance_timeout_ms,
        "fetch_max_wait_ms": settings.fetch_max_wait_ms,
    }
    tuning.update({key: value for key, value in overrides.items() if value is not None})
    if tuning["heartbeat_interval_ms"] >= tuning["session_timeout_ms"]:
        # The client rejects a heartbeat not below the session timeout; keep the ratio sane.
        tuning["heartbeat_interval_ms"] = max(tuning["session_timeout_ms"] // 3, 1)
    return tuning


class KafkaSettingsError(ValueError):
    """The Kafka security settings cannot be used (e.g. the password file is unreadable)."""


def kafka_client_options(settings: Settings) -> dict[str, Any]:
    """Connection options every Kafka client of toolexec passes besides its bootstrap
    servers: aiokafka keyword arguments (`security_protocol`, `sasl_mechanism`,
    `sasl_plain_username`, `sasl_plain_password`, `ssl_context`). Empty with PLAINTEXT,
    so nothing changes there. The password file is read on every call."""
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol in SASL_PROTOCOLS:
        options.update(sasl_mechanism=settings.kafka_sasl_mechanism,
                       sasl_plain_username=settings.kafka_sasl_username,
                       sasl_plain_password=_sasl_password(settings))
    if protocol in SSL_PROTOCOLS:
        options["ssl_context"] = kafka_ssl_context(settings.kafka_ssl_cafile)
    return options


def _sasl_password(settings: Settings) -> str:
    if settings.kafka_sasl_password is not None:
        return settings.kafka_sasl_password.get_secret_value()
    path = settings.kafka_sasl_password_file
    assert path is not None  # the model validator wants one of the two
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise KafkaSettingsError(f"cannot read kafka_sasl_password_file {path}: "
                                 f"{error.strerror or error}") from None
    password = text[:-1] if text.endswith("\n") else text
    password = password[:-1] if password.endswith("\r") else password
    if not password:
        raise KafkaSettingsError(f"kafka_sasl_password_file {path} is empty")
    return password


def faststream_security(options: Mapping[str, Any]) -> BaseSecurity | None:
    """FastStream's `security=` object for `kafka_client_options` (None with PLAINTEXT)."""
    from faststream.security import (  # noqa: PLC0415 - FastStream only where a broker is built
        BaseSecurity,
        SASLScram256,
        SASLScram512,
    )

    protocol = options.get("security_protocol", "PLAINTEXT")
    context = options.get("ssl_context")
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return BaseSecurity(ssl_context=context, use_ssl=True)
    kind = {"SCRAM-SHA-512": SASLScram512, "SCRAM-SHA-256": SASLScram256}.get(
        options.get("sasl_mechanism", ""))
    if kind is None:
        raise KafkaSettingsError(f"no FastStream security for SASL mechanism "
                                 f"{options.get('sasl_mechanism')!r}")
    return kind(options["sasl_plain_username"], options["sasl_plain_password"],
                ssl_context=context, use_ssl=protocol == "SASL_SSL")
