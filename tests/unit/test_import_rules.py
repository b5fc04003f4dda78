"""The dependency rules of docs/architecture.md, checked on every import statement
(function-level ones included): `domain` and `contracts` import none of the other
layers nor each other, consumers never import projections, the front ends (CLI, HTTP
gateway, MCP server) do not import each other, the use cases import no front end, and
inside the pipeline the adapters and the primitives import neither the steps nor the
runtime, and the steps import no adapter (the ports they use are in consumers.ports)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("contracts", "domain", "consumers", "projections", "toolexec")

HTTP = ("toolexec.gateway.http", "toolexec.gateway.access", "toolexec.gateway.body",
        "toolexec.gateway.errors", "toolexec.gateway.models", "toolexec.gateway.server",
        "toolexec.gateway.status_page")
MCP = ("toolexec.gateway.mcp",)
CLI = ("toolexec.cli",)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from toolexec import cli` imports toolexec.cli
                yield node.lineno, f"{target}.{alias.name}"


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for layer in {s.split(".")[0] for s in sources}:
        for path in sorted((ROOT / layer).rglob("*.py")):
            module = _module(path)
            if not _within(module, sources):
                continue
            for line, name in _imports(path):
                if _within(name, forbidden) and not _within(name, sources):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


RULES = {
    "contracts imports no other layer": (("contracts",), tuple(
        layer for layer in LAYERS if layer != "contracts")),
    "domain imports no other layer": (("domain",), tuple(
        layer for layer in LAYERS if layer != "domain")),
    "consumers never import projections nor the composition root": (
        ("consumers",), ("projections", "toolexec")),
    "projections never import consumers nor the composition root": (
        ("projections",), ("consumers", "toolexec")),
    "the CLI imports neither gateway": (CLI, (*HTTP, *MCP)),
    "the HTTP gateway imports neither the CLI nor the MCP server": (HTTP, (*CLI, *MCP)),
    "the MCP server imports neither the CLI nor the HTTP gateway": (MCP, (*CLI, *HTTP)),
    "the use cases import no front end": (("toolexec.usecases",), (*CLI, *HTTP, *MCP)),
    "the pipeline's adapters import neither its steps nor its runtime": (
        ("consumers.adapters",), ("consumers.steps", "consumers.runtime")),
    "the steps import no adapter: they reach them through consumers.ports": (
        ("consumers.steps",), ("consumers.adapters",)),
    "the primitives import no other part of the pipeline": (
        ("consumers.primitives",), ("consumers.steps", "consumers.runtime",
                                    "consumers.adapters")),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_dependency_rule(rule: str) -> None:
    sources, forbidden = RULES[rule]
    assert _violations(sources, forbidden) == []


def test_the_rules_see_the_front_ends() -> None:
    """A rule over modules that do not exist would pass for nothing."""
    for module in (*HTTP, *MCP, *CLI, "toolexec.usecases", "consumers.steps",
                   "consumers.runtime", "consumers.adapters", "consumers.primitives"):
        path = ROOT / Path(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), module
    assert _violations(("toolexec.cli",), ("toolexec.usecases",)) != []  # cli uses them
    assert _violations(("consumers.runtime",), ("consumers.steps",)) != []  # chains them
    assert _violations(("consumers.steps",), ("consumers.ports",)) != []  # their ports
