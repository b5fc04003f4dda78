from __future__ import annotations

import pytest

from domain.chain import ChainCache, resolve_chain
from domain.errors import (
    ChainInvalid,
    RequestError,
    ToolNotFound,
    VersionNotFound,
    VersionRemoved,
)
from domain.model import MAX_CHAIN_DEPTH
from domain.registry import InMemoryRegistry
from tests.unit.chain_builders import primitive, registry_of, runtime, script, tool


def _ids(chain) -> list[str]:
    return [f"{tv.tool_id}@{tv.version}" for tv in chain.links]


def _base() -> InMemoryRegistry:
    return registry_of(primitive(), runtime(), script("hello", "1.0.0"), script("hello", "1.2.0"),
                       script("hello", "2.0.0"))


def test_a_script_resolves_down_to_its_primitive():
    chain = resolve_chain(_base(), "hello", "^1.0.0")
    assert _ids(chain) == ["hello@1.2.0", "python_runtime@1.0.0", "subprocess@1.0.0"]
    assert chain.warnings == ()


def test_the_default_range_picks_the_highest_version():
    assert resolve_chain(_base(), "hello").leaf.version == "2.0.0"


def test_an_unknown_tool_is_tool_not_found():
    with pytest.raises(ToolNotFound) as raised:
        resolve_chain(_base(), "nope")
    assert raised.value.code == "E3101"


def test_no_satisfying_version_lists_the_available_ones():
    with pytest.raises(VersionNotFound) as raised:
        resolve_chain(_base(), "hello", "^3.0.0")
    assert raised.value.code == "E3102"
    assert raised.value.details["available"] == ["1.0.0", "1.2.0", "2.0.0"]


def test_a_bad_requested_range_is_a_request_error():
    with pytest.raises(RequestError):
        resolve_chain(_base(), "hello", "not a range")


def test_removed_versions_never_resolve():
    registry = _base()
    registry.set_lifecycle("hello", "2.0.0", "removed")
    assert resolve_chain(registry, "hello").leaf.version == "1.2.0"


def test_a_removed_only_match_is_gone_with_e3104():
    registry = _base()
    registry.set_lifecycle("hello", "2.0.0", "removed", reason="leaks memory",
                           replacement_tool_id="hello_v3")
    with pytest.raises(VersionRemoved) as raised:
        resolve_chain(registry, "hello", "^2.0.0")
    assert raised.value.code == "E3104"
    assert raised.value.details["removed"] == ["2.0.0"]
    assert "2.0.0" not in raised.value.details["available"]
    assert raised.value.details["replacement_tool_id"] == "hello_v3"
    assert "leaks memory" in raised.value.message


def test_a_removed_pinned_version_is_gone_with_e3104():
    registry = _base()
    registry.set_lifecycle("hello", "1.0.0", "removed")
    with pytest.raises(VersionRemoved):
        resolve_chain(registry, "hello", pins={"hello": "1.0.0"})


def test_a_range_matching_no_version_at_all_stays_version_not_found():
    registry = _base()
    registry.set_lifecycle("hello", "2.0.0", "removed")
    with pytest.raises(VersionNotFound):
        resolve_chain(registry, "hello", "^7")


def test_a_deprecation_warning_carries_the_reason_and_the_replacement():
    registry = _base()
    registry.set_lifecycle("hello", "2.0.0", "deprecated", reason="slow",
                           replacement_tool_id="hello_v3")
    assert resolve_chain(registry, "hello").warnings == (
        "hello@2.0.0 is deprecated: slow; use hello_v3 instead",)


def test_a_deprecated_version_resolves_with_a_warning():
    registry = _base()
    registry.set_lifecycle("hello", "2.0.0", "deprecated")
    chain = resolve_chain(registry, "hello")
    assert chain.leaf.version == "2.0.0"
    assert chain.warnings == ("hello@2.0.0 is deprecated",)


def test_a_sunset_warning_names_the_replacement():
    registry = registry_of(primitive(), runtime(),
                           script("old", lifecycle="sunset", replacement_tool_id="new_tool"))
    assert "use new_tool instead" in resolve_chain(registry, "old").warnings[0]


def test_a_bare_executor_name_prefers_the_highest_active_version():
    registry = registry_of(primitive(), runtime("python_runtime", "1.0.0"),
                           runtime("python_runtime", "2.0.0", lifecycle="deprecated"), script())
    chain = resolve_chain(registry, "hello")
    assert chain.links[1].version == "1.0.0"
    assert chain.warnings == ()


def test_an_executor_with_a_range_picks_within_it():
    registry = registry_of(primitive(), runtime("python_runtime", "1.4.0"),
                           runtime("python_runtime", "2.0.0"),
                           script(executor="python_runtime@^1.0.0"))
    assert resolve_chain(registry, "hello").links[1].version == "1.4.0"


def test_an_executor_with_a_bad_range_makes_the_chain_invalid():
    registry = registry_of(primitive(), runtime(), script(executor="python_runtime@>=nope"))
    with pytest.raises(ChainInvalid) as raised:
        resolve_chain(registry, "hello")
    assert raised.value.details["executor"] == "python_runtime@>=nope"


def test_pins_override_the_range_for_every_link():
    registry = registry_of(primitive(), runtime("python_runtime", "1.0.0"),
                           runtime("python_runtime", "1.5.0"), script("hello", "1.0.0"),
                           script("hello", "1.1.0"))
    chain = resolve_chain(registry, "hello", "*", pins={"hello": "1.0.0", "python_runtime": "1.0.0"})
    assert _ids(chain) == ["hello@1.0.0", "python_runtime@1.0.0", "subprocess@1.0.0"]


def test_a_pin_to_a_missing_version_is_version_not_found():
    with pytest.raises(VersionNotFound) as raised:
        resolve_chain(_base(), "hello", pins={"hello": "9.9.9"})
    assert raised.value.details["pinned"] == "9.9.9"


def test_a_missing_executor_link_is_named():
    registry = registry_of(primitive(), script(executor="ruby_runtime"))
    with pytest.raises(ToolNotFound) as raised:
        resolve_chain(registry, "hello")
    assert raised.value.details == {"tool_id": "ruby_runtime", "required_by": "hello@1.0.0"}
    assert "ruby_runtime" in raised.value.message


def test_a_cycle_is_rejected_naming_the_cycle():
    registry = registry_of(runtime("aaa", executor="bbb"), runtime("bbb", executor="ccc"),
                           runtime("ccc", executor="aaa"), script(executor="aaa"))
    with pytest.raises(ChainInvalid) as raised:
        resolve_chain(registry, "hello")
    assert raised.value.details["cycle"] == ["aaa", "bbb", "ccc", "aaa"]
    assert "aaa -> bbb -> ccc -> aaa" in raised.value.message


def test_a_tool_that_is_its_own_executor_is_a_cycle():
    registry = registry_of(runtime("loop", executor="loop"))
    with pytest.raises(ChainInvalid) as raised:
        resolve_chain(registry, "loop")
    assert raised.value.details["cycle"] == ["loop", "loop"]


def _ladder(length: int) -> InMemoryRegistry:
    """A chain of `length` links: r1 -> r2 -> ... -> subprocess."""
    names = [f"r{i}" for i in range(1, length)]
    links = [runtime(name, executor=nxt) for name, nxt in zip(names, [*names[1:], "subprocess"],
                                                              strict=True)]
    return registry_of(primitive(), *links)


def test_a_chain_of_the_maximum_depth_resolves():
    assert len(resolve_chain(_ladder(MAX_CHAIN_DEPTH), "r1").links) == MAX_CHAIN_DEPTH


def test_a_chain_of_depth_17_is_rejected():
    with pytest.raises(ChainInvalid) as raised:
        resolve_chain(_ladder(MAX_CHAIN_DEPTH + 1), "r1")
    assert raised.value.details["max_depth"] == 16


def test_a_chain_must_end_in_a_primitive():
    registry = registry_of(tool("notes", tool_type="knowledge"))
    with pytest.raises(ChainInvalid, match="does not end in a primitive"):
        resolve_chain(registry, "notes")


def test_a_primitive_outside_the_known_two_is_rejected():
    registry = registry_of(primitive("teleport"), script(executor="teleport"))
    with pytest.raises(ChainInvalid, match="not a known primitive"):
        resolve_chain(registry, "hello")


def test_a_primitive_alone_is_a_chain_of_one():
    assert _ids(resolve_chain(_base(), "subprocess")) == ["subprocess@1.0.0"]


def test_chain_cache_reuses_a_resolution_for_the_same_revision():
    registry, cache = _base(), ChainCache()
    first = cache.resolve(registry, "hello", "*", revision=registry.revision)
    assert cache.resolve(registry, "hello", "*", revision=registry.revision) is first


def test_chain_cache_sees_a_new_publish_through_the_revision():
    registry, cache = _base(), ChainCache()
    cache.resolve(registry, "hello", "*", revision=registry.revision)
    registry.add(script("hello", "3.0.0"))
    assert cache.resolve(registry, "hello", "*", revision=registry.revision).leaf.version == "3.0.0"
