"""Helpers of the rights tests: a `toolexec up` with authorization on, and capability
tokens signed directly with its dev key (any claims, including hostile ones)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from tests.integration.gateway_support import RunningGateway, running_gateway

TOOLS = Path(__file__).parent / "tools"
AUTH = {"TOOLEXEC_REQUIRE_AUTH": "true"}


def secured_gateway(tmp_path_factory: pytest.TempPathFactory,
                    name: str) -> Iterator[RunningGateway]:
    """`toolexec up` (examples and the integration test tools) requiring tokens."""
    with running_gateway(tmp_path_factory.mktemp(name), env=AUTH) as running:
        yield running


def sign(cwd: Path, *, sub: str, tools: Sequence[tuple[str, str]] = (),
         scopes: dict[str, Any] | None = None, ttl: int = 300, **claims: Any) -> str:
    """A token signed with the dev key of the `up` running in `cwd`. `claims` override
    (e.g. exp=1e30, iat in the future)."""
    key = serialization.load_pem_private_key(
        (cwd / ".toolexec" / "keys" / "private.pem").read_bytes(), password=None)
    now = int(time.time())
    body: dict[str, Any] = {"sub": sub, "iat": now, "exp": now + int(ttl), "jti": str(uuid.uuid4()),
                            "tools": [{"tool_id": t, "version_range": r} for t, r in tools]}
    if scopes is not None:
        body["scopes"] = scopes
    body.update(claims)
    return jwt.encode(body, key, algorithm="RS256")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def manifest_of(tool_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((tool_dir / "tool.yaml").read_text(encoding="utf-8"))


def script_tool(tool_id: str, version: str = "1.0.0", *, executor: str = "python_runtime",
                greeting: str = "hi") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A small Python script tool (manifest, files) as `POST /v1/tools/register` takes it."""
    manifest = {"tool_id": tool_id, "version": version, "tool_type": "script",
                "executor": executor, "config": {"entrypoint": "main.py"},
                "description": f"A small test tool that says {greeting}.", "parameters": {"type": "object"}}
    code = f"import json\nprint(json.dumps({{'greeting': {greeting!r}}}))\n"
    return manifest, [{"path": "main.py", "content": code}]
