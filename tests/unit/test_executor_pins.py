"""A published version runs on the executor version it was published with, whatever is
published later; publishing plans pin, refuse changed versions and skip repeats."""

from __future__ import annotations

from dataclasses import replace

import pytest

from domain.chain import ChainCache, pin_executor, resolve_chain
from domain.child_validation import ensure_chain_valid
from domain.errors import (
    ChainInvalid,
    IntegrityMismatch,
    LockfileError,
    ToolNotFound,
    VersionConflict,
    VersionRemoved,
)
from domain.lockfile import freeze, parse_lockfile, verify_lockfile
from domain.model import ExecutorPin, ToolVersion
from domain.publication import plan_publication
from domain.registry import InMemoryRegistry
from tests.unit.chain_builders import primitive, registry_of, runtime, script

HOSTILE = {"command": "python3", "base_args": ["-c", "print('{\"greeting\": \"pwned\"}')"]}


def _ids(chain) -> list[str]:
    return [f"{tv.tool_id}@{tv.version}" for tv in chain.links]


def _published(registry: InMemoryRegistry, *versions: ToolVersion) -> InMemoryRegistry:
    """`versions` published in order, as a publisher plans them, into `registry`."""
    for plan in plan_publication(versions, registry):
        assert plan.outcome == "new", plan.error
        registry.add(plan.version)
    return registry


def _pinned_world() -> InMemoryRegistry:
    return _published(InMemoryRegistry(), primitive(), runtime(), script("hello", "1.0.0"))


def test_a_published_version_is_pinned_to_the_executor_active_then() -> None:
    registry = _pinned_world()
    hello = registry.get("hello", "1.0.0")
    python = registry.get("python_runtime", "1.0.0")
    assert hello is not None and python is not None
    assert hello.executor_pin == ExecutorPin("python_runtime", "1.0.0", python.integrity)
    assert registry.get("subprocess", "1.0.0").executor_pin is None  # type: ignore[union-attr]


def test_a_newer_runtime_never_changes_an_existing_tool() -> None:
    registry = _published(_pinned_world(), runtime(version="1.0.2", config=HOSTILE))
    assert _ids(resolve_chain(registry, "hello")) == [
        "hello@1.0.0", "python_runtime@1.0.0", "subprocess@1.0.0"]


def test_a_newer_runtime_without_child_schemas_does_not_break_existing_tools() -> None:
    registry = _published(_pinned_world(), runtime(version="1.1.0", validation={}))
    chain = resolve_chain(registry, "hello")
    assert ensure_chain_valid(chain, strict=True) == []


def test_moving_to_a_new_runtime_is_a_new_version_of_the_tool() -> None:
    registry = _published(_pinned_world(), runtime(version="1.1.0"))
    _published(registry, script("hello", "1.1.0"))
    assert _ids(resolve_chain(registry, "hello")) == [
        "hello@1.1.0", "python_runtime@1.1.0", "subprocess@1.0.0"]
    assert _ids(resolve_chain(registry, "hello", "1.0.0"))[1] == "python_runtime@1.0.0"


def test_a_version_without_a_pin_still_follows_the_range() -> None:
    registry = registry_of(primitive(), runtime(), runtime(version="1.1.0"), script())
    assert _ids(resolve_chain(registry, "hello"))[1] == "python_runtime@1.1.0"


def test_pins_prefer_active_versions_in_range() -> None:
    registry = registry_of(primitive(), runtime(), runtime(version="1.1.0", lifecycle="deprecated"),
                           runtime(version="2.0.0"))
    pin = pin_executor(registry, script(executor="python_runtime@^1"))
    assert pin is not None and pin.version == "1.0.0"


def test_a_removed_pinned_executor_fails_with_E3104() -> None:
    registry = _pinned_world()
    registry.set_lifecycle("python_runtime", "1.0.0", "removed")
    _published(registry, runtime(version="1.0.1"))
    with pytest.raises(VersionRemoved):
        resolve_chain(registry, "hello")


def test_a_pinned_executor_with_other_contents_fails_integrity() -> None:
    registry = _pinned_world()
    swapped = runtime(config=HOSTILE)  # same version, other bytes (a registry forged by hand)
    forged = registry_of(*(tv for tid in registry.tool_ids() for tv in registry.versions(tid)
                           if tv.tool_id != "python_runtime"), swapped)
    with pytest.raises(IntegrityMismatch) as raised:
        resolve_chain(forged, "hello")
    assert raised.value.details["expected"] != raised.value.details["actual"]


def test_a_pin_naming_another_tool_than_the_executor_is_invalid() -> None:
    registry = _pinned_world()
    hello = registry.get("hello", "1.0.0")
    assert hello is not None and hello.executor_pin is not None
    registry.add(replace(hello, version="1.0.1",
                         executor_pin=replace(hello.executor_pin, tool_id="node_runtime")))
    with pytest.raises(ChainInvalid):
        resolve_chain(registry, "hello", "1.0.1")


def test_a_cached_resolution_keeps_the_pin() -> None:
    registry, cache = _pinned_world(), ChainCache()
    cache.resolve(registry, "hello", revision=registry.revision)
    _published(registry, runtime(version="1.0.2", config=HOSTILE))
    chain = cache.resolve(registry, "hello", revision=registry.revision)
    assert chain.links[1].version == "1.0.0"


# --- lockfiles -------------------------------------------------------------------------


def test_lockfiles_of_pinned_chains_keep_working() -> None:
    registry = _published(_pinned_world(), runtime(version="1.0.2"))
    lock = parse_lockfile(freeze(resolve_chain(registry, "hello"), generated_at="t",
                                 registry_url="r"))
    assert _ids(verify_lockfile(lock, registry)) == [
        "hello@1.0.0", "python_runtime@1.0.0", "subprocess@1.0.0"]


def test_a_lockfile_putting_another_executor_under_a_pinned_tool_is_refused() -> None:
    registry = _published(_pinned_world(), runtime(version="1.0.2", config=HOSTILE))
    chain = resolve_chain(registry, "hello")
    other = registry.get("python_runtime", "1.0.2")
    assert other is not None
    lock = parse_lockfile(freeze(replace(chain, links=(chain.links[0], other, chain.links[2])),
                                 generated_at="t", registry_url="r"))
    with pytest.raises(LockfileError) as raised:
        verify_lockfile(lock, registry)
    assert "python_runtime@1.0.0" in raised.value.message
    with pytest.raises(ChainInvalid):
        resolve_chain(registry, "hello", pins={"hello": "1.0.0", "python_runtime": "1.0.2"})


# --- planning a publication ------------------------------------------------------------


def test_the_same_version_with_the_same_bytes_is_unchanged() -> None:
    registry = _pinned_world()
    [plan] = plan_publication([script("hello", "1.0.0")], registry)
    assert plan.outcome == "unchanged" and plan.version is registry.get("hello", "1.0.0")


def test_the_same_version_with_other_bytes_is_a_conflict() -> None:
    registry = _pinned_world()
    [plan] = plan_publication([script("hello", "1.0.0", description="changed")], registry)
    assert plan.outcome == "conflict" and isinstance(plan.error, VersionConflict)
    assert plan.error.code == "E3103"
    assert plan.error.details["published_integrity"] == registry.get(  # type: ignore[union-attr]
        "hello", "1.0.0").integrity


def test_an_executor_in_the_same_batch_is_published_first() -> None:
    plans = plan_publication([script("hello"), runtime(), primitive()], InMemoryRegistry())
    assert [p.outcome for p in plans] == ["new", "new", "new"]
    assert str(plans[0].version.executor_pin) == "python_runtime@1.0.0"
    assert str(plans[1].version.executor_pin) == "subprocess@1.0.0"


def test_a_batch_pins_to_its_own_newer_runtime() -> None:
    plans = plan_publication([script("hello", "2.0.0"), runtime(version="1.5.0")],
                             _pinned_world())
    assert str(plans[0].version.executor_pin) == "python_runtime@1.5.0"


def test_a_tool_whose_executor_is_nowhere_is_unresolvable() -> None:
    [plan] = plan_publication([script("rb_tool", executor="ruby_runtime")], _pinned_world())
    assert plan.outcome == "unresolvable" and isinstance(plan.error, ToolNotFound)


def test_two_different_copies_of_one_version_in_a_batch_keep_the_first() -> None:
    plans = plan_publication([script("tool_a"), script("tool_a", description="other")],
                             _pinned_world())
    assert [p.outcome for p in plans] == ["new", "conflict"]
