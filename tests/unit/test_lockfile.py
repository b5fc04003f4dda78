from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from domain.chain import resolve_chain
from domain.errors import (
    IntegrityMismatch,
    LockfileError,
    ToolNotFound,
    VersionNotFound,
    VersionRemoved,
)
from domain.lockfile import freeze, locked_definition, parse_lockfile, pins, verify_lockfile
from domain.registry import InMemoryRegistry
from tests.unit.chain_builders import primitive, registry_of, runtime, script

NOW = "2026-01-24T12:00:00Z"
URL = "https://registry.example"


def _registry() -> InMemoryRegistry:
    return registry_of(primitive(), runtime(), script("hello", "1.0.0"), script("hello", "1.1.0"))


def _lock(registry: InMemoryRegistry | None = None) -> dict[str, Any]:
    chain = resolve_chain(registry or _registry(), "hello", "^1.0.0")
    return freeze(chain, generated_at=NOW, registry_url=URL)


def test_freeze_writes_the_seed_format_version_1():
    lock = _lock()
    assert lock["lockfile_version"] == 1
    assert lock["generated_at"] == NOW
    assert lock["registry"] == {"url": URL, "fetched_at": NOW}
    assert [(e["tool_id"], e["version"], e["executor"]) for e in lock["resolved_chain"]] == [
        ("hello", "1.1.0", "python_runtime"), ("python_runtime", "1.0.0", "subprocess"),
        ("subprocess", "1.0.0", None)]
    assert lock["root"] == {k: lock["resolved_chain"][0][k] for k in ("tool_id", "version", "integrity")}


def test_a_frozen_lockfile_is_plain_json():
    assert json.loads(json.dumps(_lock())) == _lock()


def test_parse_then_pins_gives_exact_versions():
    assert pins(parse_lockfile(_lock())) == {"hello": "1.1.0", "python_runtime": "1.0.0",
                                             "subprocess": "1.0.0"}


def test_verify_lockfile_returns_the_locked_chain_in_lock_order():
    registry = _registry()
    lock = parse_lockfile(_lock(registry))
    registry.add(script("hello", "1.2.0"))  # newer, but the lock pins 1.1.0
    chain = verify_lockfile(lock, registry)
    assert [tv.version for tv in chain.links] == ["1.1.0", "1.0.0", "1.0.0"]


def test_pins_from_a_lockfile_reproduce_the_resolution():
    registry = _registry()
    lock = parse_lockfile(_lock(registry))
    registry.add(script("hello", "1.2.0"))
    assert resolve_chain(registry, "hello", "^1.0.0", pins=pins(lock)).leaf.version == "1.1.0"


def test_integrity_drift_names_both_hashes():
    registry = _registry()
    lock = parse_lockfile(_lock(registry))
    republished = script("hello", "1.1.0", config={"entrypoint": "main.py", "extra": True})
    registry.add(republished)
    with pytest.raises(IntegrityMismatch) as raised:
        verify_lockfile(lock, registry)
    assert raised.value.details["expected"] == lock.root.integrity
    assert raised.value.details["actual"] == republished.integrity


def test_a_locked_version_missing_from_the_registry_is_version_not_found():
    lock = parse_lockfile(_lock())
    registry = registry_of(primitive(), runtime(), script("hello", "1.0.0"))
    with pytest.raises(VersionNotFound) as raised:
        verify_lockfile(lock, registry)
    assert raised.value.details["available"] == ["1.0.0"]


def test_a_locked_tool_missing_from_the_registry_is_tool_not_found():
    lock = parse_lockfile(_lock())
    with pytest.raises(ToolNotFound):
        verify_lockfile(lock, registry_of(primitive(), runtime()))


def test_a_removed_locked_version_does_not_resolve():
    registry = _registry()
    lock = parse_lockfile(_lock(registry))
    registry.set_lifecycle("hello", "1.1.0", "removed")
    with pytest.raises(VersionRemoved):
        verify_lockfile(lock, registry)


def test_a_deprecated_locked_version_resolves_with_a_warning():
    registry = _registry()
    lock = parse_lockfile(_lock(registry))
    registry.set_lifecycle("hello", "1.1.0", "deprecated")
    assert verify_lockfile(lock, registry).warnings == ("hello@1.1.0 is deprecated",)


def test_a_lockfile_whose_order_disagrees_with_the_manifests_is_rejected():
    registry = _registry()
    other = runtime("other_runtime")
    registry.add(other)
    data = _lock(registry)
    data["resolved_chain"][1] = {**data["resolved_chain"][1], "tool_id": "other_runtime",
                                 "integrity": other.integrity}
    data["resolved_chain"][0]["executor"] = "other_runtime"
    with pytest.raises(LockfileError, match="runs on 'python_runtime'"):
        verify_lockfile(parse_lockfile(data), registry)


def _broken(mutate) -> dict[str, Any]:
    data = copy.deepcopy(_lock())
    mutate(data)
    return data


@pytest.mark.parametrize(("mutate", "path"), [
    (lambda d: d.update(lockfile_version=2), "$.lockfile_version"),
    (lambda d: d.update(resolved_chain=[]), "$.resolved_chain"),
    (lambda d: d["resolved_chain"].__setitem__(0, "hello"), "$.resolved_chain[0]"),
    (lambda d: d["resolved_chain"][0].pop("tool_id"), "$.resolved_chain[0].tool_id"),
    (lambda d: d["resolved_chain"][1].update(version="1.0"), "$.resolved_chain[1].version"),
    (lambda d: d["resolved_chain"][2].update(integrity="md5:abc"), "$.resolved_chain[2].integrity"),
    (lambda d: d["resolved_chain"][0].update(executor="subprocess"), "$.resolved_chain[0].executor"),
    (lambda d: d["resolved_chain"][2].update(executor="hello"), "$.resolved_chain[2].executor"),
    (lambda d: d["root"].update(version="9.9.9"), "$.root.version"),
    (lambda d: d.update(registry="nowhere"), "$.registry"),
])
def test_a_malformed_lockfile_is_a_clear_lockfile_error(mutate, path: str):
    with pytest.raises(LockfileError) as raised:
        parse_lockfile(_broken(mutate))
    assert raised.value.details["path"] == path
    assert raised.value.code == "E3105"


def test_a_lockfile_that_is_not_an_object_is_rejected():
    with pytest.raises(LockfileError):
        parse_lockfile(["not", "a", "lockfile"])  # type: ignore[arg-type]


def test_a_lockfile_listing_a_tool_twice_is_rejected():
    data = _lock()
    first = data["resolved_chain"][0]
    data["resolved_chain"] = [{**first, "executor": "hello"}, {**first, "executor": None}]
    with pytest.raises(LockfileError, match="appears twice"):
        parse_lockfile(data)


def test_a_parsed_lockfile_keeps_registry_and_time():
    lock = parse_lockfile(_lock())
    assert (lock.generated_at, lock.registry_url, lock.fetched_at) == (NOW, URL, NOW)
    assert lock.root.tool_id == "hello"


def test_a_definition_hash_is_pinned_on_its_entry_and_read_back():
    chain = resolve_chain(_registry(), "hello", "^1.0.0")
    digest = "sha256:" + "de" * 32
    lock = freeze(chain, generated_at=NOW, registry_url=URL, definitions={"hello": digest})
    assert lock["resolved_chain"][0]["definition_hash"] == digest
    assert "definition_hash" not in lock["resolved_chain"][1]
    assert locked_definition(lock) == digest
    assert locked_definition(_lock()) is None  # entries without one stay as they were


def test_a_malformed_definition_hash_is_a_lockfile_error():
    lock = _lock()
    lock["resolved_chain"][0]["definition_hash"] = "sha256:nope"
    with pytest.raises(LockfileError) as bad:
        parse_lockfile(lock)
    assert bad.value.details["path"] == "$.resolved_chain[0].definition_hash"
