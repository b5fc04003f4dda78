"""Small builders of sealed tool versions and registries for the chain-related tests."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from domain.integrity import seal
from domain.model import ToolFile, ToolSource, ToolVersion
from domain.registry import InMemoryRegistry

BUILTIN_DIR = Path(__file__).resolve().parents[2] / "toolexec" / "builtin_tools"

ACCEPT_ANY_CHILD: dict[str, Any] = {"child_schemas": [{"match": {}, "schema": {}}]}


def tool_file(path: str, content: bytes, executable: bool = False) -> ToolFile:
    return ToolFile(path, hashlib.sha256(content).hexdigest(), executable, content)


def tool(tool_id: str, version: str = "1.0.0", *, tool_type: str = "script",
         executor: str | None = None, config: dict[str, Any] | None = None,
         files: tuple[ToolFile, ...] = (), lifecycle: str = "active",
         **extra: Any) -> ToolVersion:
    manifest: dict[str, Any] = {"tool_id": tool_id, "version": version,
                                "tool_type": tool_type, "executor": executor,
                                "config": config or {}, "parameters": {"type": "object"},
                                **extra}
    return replace(seal(ToolSource(manifest, files)), lifecycle=lifecycle)


def primitive(tool_id: str = "subprocess", version: str = "1.0.0", **extra: Any) -> ToolVersion:
    extra.setdefault("validation", ACCEPT_ANY_CHILD)
    return tool(tool_id, version, tool_type="primitive", **extra)


def runtime(tool_id: str = "python_runtime", version: str = "1.0.0", *,
            executor: str = "subprocess", **extra: Any) -> ToolVersion:
    extra.setdefault("config", {"command": "python3", "base_args": ["-u"]})
    extra.setdefault("validation", ACCEPT_ANY_CHILD)
    return tool(tool_id, version, tool_type="runtime", executor=executor, **extra)


def script(tool_id: str = "hello", version: str = "1.0.0", *,
           executor: str = "python_runtime", **extra: Any) -> ToolVersion:
    extra.setdefault("config", {"entrypoint": "main.py"})
    extra.setdefault("files", (tool_file("main.py", b"print('hi')\n"),))
    return tool(tool_id, version, tool_type="script", executor=executor, **extra)


def registry_of(*versions: ToolVersion) -> InMemoryRegistry:
    return InMemoryRegistry(versions)


def builtin(name: str) -> ToolVersion:
    """A built-in tool, read straight from toolexec/builtin_tools and sealed."""
    manifest = yaml.safe_load((BUILTIN_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    return seal(ToolSource(manifest, (), origin=name, layout="builtin"))
