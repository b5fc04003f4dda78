from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import IntegrityMismatch, RegistryError
from domain.integrity import (
    IntegrityCache,
    compute_integrity,
    file_sha256,
    seal,
    verify_chain,
    verify_tool,
)
from domain.model import ResolvedChain, ToolFile, ToolSource
from tests.unit.chain_builders import primitive, runtime, script, tool_file

# ------------------------------------------------------------------ strategies

_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=12)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_keys, inner, max_size=4), max_leaves=12)
_manifests = st.dictionaries(_keys, _json, min_size=1, max_size=6)
_paths = st.text(alphabet="abcdefgh/._", min_size=1, max_size=10)
_files = st.dictionaries(_paths, st.tuples(st.binary(min_size=1, max_size=64), st.booleans()),
                         min_size=1, max_size=5)


def _file_list(files: dict[str, tuple[bytes, bool]]) -> list[ToolFile]:
    return [tool_file(path, content, executable) for path, (content, executable) in files.items()]


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(v) for v in value]
    return value


# ------------------------------------------------------------------ properties


@given(_manifests, _files)
def test_integrity_ignores_manifest_key_order_and_file_order(manifest: dict[str, Any],
                                                            files: dict[str, tuple[bytes, bool]]):
    listed = _file_list(files)
    original = compute_integrity("t", "1.0.0", manifest, listed)
    assert compute_integrity("t", "1.0.0", _reordered(manifest), list(reversed(listed))) == original


@given(_files, st.data())
def test_integrity_changes_when_any_byte_of_any_file_changes(files: dict[str, tuple[bytes, bool]],
                                                             data: st.DataObject):
    listed = _file_list(files)
    index = data.draw(st.integers(0, len(listed) - 1))
    target = listed[index]
    assert target.content is not None
    position = data.draw(st.integers(0, len(target.content) - 1))
    changed = bytearray(target.content)
    changed[position] ^= data.draw(st.integers(1, 255))
    tampered = [*listed[:index], tool_file(target.path, bytes(changed), target.is_executable),
                *listed[index + 1:]]
    assert compute_integrity("t", "1.0.0", {}, tampered) != compute_integrity("t", "1.0.0", {}, listed)


@given(_manifests, st.data())
def test_integrity_changes_when_a_manifest_value_changes(manifest: dict[str, Any],
                                                          data: st.DataObject):
    key = data.draw(st.sampled_from(sorted(manifest)))
    new_value = data.draw(_json.filter(lambda v: json.dumps(v) != json.dumps(manifest[key])))
    changed = {**manifest, key: new_value}
    assert compute_integrity("t", "1.0.0", changed, []) != compute_integrity("t", "1.0.0", manifest, [])


@given(_files, st.data())
def test_integrity_changes_when_an_executable_bit_flips(files: dict[str, tuple[bytes, bool]],
                                                        data: st.DataObject):
    listed = _file_list(files)
    index = data.draw(st.integers(0, len(listed) - 1))
    flipped = list(listed)
    flipped[index] = replace(listed[index], is_executable=not listed[index].is_executable)
    assert compute_integrity("t", "1.0.0", {}, flipped) != compute_integrity("t", "1.0.0", {}, listed)


# ------------------------------------------------------------------ examples


def test_integrity_is_sha256_over_rfc8785_canonical_json():
    manifest = {"b": 1, "a": [True, None]}
    file = tool_file("x.py", b"x")
    canonical = (
        '{"files":[{"is_executable":false,"path":"x.py","sha256":"' + file.sha256 + '"}],'
        '"manifest":{"a":[true,null],"b":1},"tool_id":"t","version":"1.0.0"}'
    ).encode()
    expected = "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert compute_integrity("t", "1.0.0", manifest, [file]) == expected


def test_file_sha256_is_lowercase_hex():
    assert file_sha256(b"abc") == hashlib.sha256(b"abc").hexdigest()


def test_seal_takes_id_and_version_from_the_manifest():
    sealed = seal(ToolSource({"tool_id": "hello", "version": "1.2.3", "tool_type": "script"}))
    assert (sealed.tool_id, sealed.version) == ("hello", "1.2.3")
    assert sealed.integrity == compute_integrity("hello", "1.2.3", sealed.manifest, ())


def test_seal_rejects_a_file_whose_content_does_not_match_its_sha256():
    bad = ToolFile("main.py", file_sha256(b"original"), False, b"tampered")
    with pytest.raises(IntegrityMismatch) as raised:
        seal(ToolSource({"tool_id": "hello", "version": "1.0.0"}, (bad,)))
    assert raised.value.details["file"] == "main.py"


def test_seal_needs_a_tool_id_and_version():
    with pytest.raises(RegistryError):
        seal(ToolSource({"tool_type": "script"}))


def test_manifest_values_json_cannot_carry_are_rejected():
    with pytest.raises(RegistryError):
        compute_integrity("t", "1.0.0", {"when": object()}, [])


def test_an_untouched_tool_verifies():
    verify_tool(script(), cache=None)


def test_a_tampered_manifest_fails_with_both_hashes():
    original = script()
    tampered = replace(original, manifest={**original.manifest, "description": "evil"})
    with pytest.raises(IntegrityMismatch) as raised:
        verify_tool(tampered, cache=None)
    assert raised.value.code == "E3105"
    assert raised.value.details["expected"] == original.integrity
    assert raised.value.details["actual"] != original.integrity


def test_tampered_file_content_fails_naming_the_file():
    original = script()
    file = original.files[0]
    tampered = replace(original, files=(replace(file, content=b"import os\n"),))
    with pytest.raises(IntegrityMismatch) as raised:
        verify_tool(tampered, cache=None)
    assert raised.value.details["file"] == "main.py"


def test_verify_chain_names_the_first_mismatching_tool():
    leaf, parent, root = script(), runtime(), primitive()
    broken_parent = replace(parent, manifest={**parent.manifest, "config": {"command": "sh"}})
    broken_root = replace(root, manifest={**root.manifest, "description": "x"})
    with pytest.raises(IntegrityMismatch) as raised:
        verify_chain(ResolvedChain((leaf, broken_parent, broken_root)), cache=None)
    assert raised.value.details["tool_id"] == "python_runtime"


def test_verify_chain_accepts_a_plain_sequence():
    verify_chain([script(), runtime(), primitive()], cache=None)


def test_cache_makes_repeat_verification_a_lookup():
    cache = IntegrityCache()
    tv = script()
    verify_tool(tv, cache=cache)
    assert tv in cache
    assert len(cache) == 1


def test_cache_does_not_vouch_for_an_equal_but_different_object():
    cache = IntegrityCache()
    tv = script()
    verify_tool(tv, cache=cache)
    tampered = replace(tv, files=(replace(tv.files[0], content=b"other"),))
    with pytest.raises(IntegrityMismatch):
        verify_tool(tampered, cache=cache)


def test_cache_evicts_the_least_recently_used_entry():
    cache = IntegrityCache(max_entries=2)
    a, b, c = script("aaa"), script("bbb"), script("ccc")
    for tv in (a, b, c):
        cache.add(tv)
    assert a not in cache and b in cache and c in cache


@settings(max_examples=25)
@given(st.binary(min_size=1, max_size=32))
def test_a_failed_verification_is_never_cached(content: bytes):
    cache = IntegrityCache()
    tv = script(files=(tool_file("main.py", content),))
    tampered = replace(tv, integrity="sha256:" + "0" * 64)
    for _ in range(2):
        with pytest.raises(IntegrityMismatch):
            verify_tool(tampered, cache=cache)
    assert len(cache) == 0
