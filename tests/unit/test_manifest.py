from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from domain.manifest import MANIFEST_SCHEMA, normalise_manifest, split_frontmatter
from toolexec.sources import manifest_schema_text

SCHEMA_FILE = Path(__file__).parents[2] / "contracts" / "schemas" / "tool-manifest.schema.json"


def test_manifest_schema_is_a_valid_draft_2020_12_schema() -> None:
    Draft202012Validator.check_schema(MANIFEST_SCHEMA)


def test_exported_schema_file_matches_the_code() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == manifest_schema_text()
    assert json.loads(SCHEMA_FILE.read_text(encoding="utf-8")) == MANIFEST_SCHEMA


def test_name_description_provider_protocol_are_optional() -> None:
    minimal = {"tool_id": "hello", "version": "1.0.0", "tool_type": "script"}
    assert list(Draft202012Validator(MANIFEST_SCHEMA).iter_errors(minimal)) == []


def test_executor_id_becomes_executor() -> None:
    assert normalise_manifest({"executor_id": "python_runtime"}) == {
        "executor": "python_runtime", "parameters": {"type": "object"}}


def test_conflicting_executor_and_executor_id_are_both_kept() -> None:
    manifest = normalise_manifest({"executor": "a_runtime", "executor_id": "b_runtime"})
    assert (manifest["executor"], manifest["executor_id"]) == ("a_runtime", "b_runtime")


def test_parameter_list_becomes_a_closed_object_schema() -> None:
    manifest = normalise_manifest({"parameters": [
        {"name": "city", "type": "string", "required": True, "description": "where"},
        {"name": "units", "type": "string", "enum": ["c", "f"], "default": "c"},
    ]})
    assert manifest["parameters"] == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "where"},
            "units": {"type": "string", "enum": ["c", "f"], "default": "c"},
        },
        "required": ["city"],
        "additionalProperties": False,
    }


def test_missing_parameters_accept_any_object() -> None:
    assert normalise_manifest({})["parameters"] == {"type": "object"}


def test_parameter_list_with_a_nameless_entry_is_left_for_validation() -> None:
    entries = [{"type": "string"}]
    assert normalise_manifest({"parameters": entries})["parameters"] == entries


def test_numeric_version_is_coerced_to_text() -> None:
    assert normalise_manifest({"version": 1.5})["version"] == "1.5"


def test_yaml_dates_become_iso_text() -> None:
    assert normalise_manifest({"deprecation_date": date(2026, 1, 2)})["deprecation_date"] == "2026-01-02"


def test_normalise_does_not_modify_its_input() -> None:
    raw = {"executor_id": "x_runtime", "config": {"env": {"A": "1"}}, "parameters": [
        {"name": "a", "type": "string", "required": True}]}
    snapshot = json.loads(json.dumps(raw))
    normalised = normalise_manifest(raw)
    normalised["config"]["env"]["A"] = "2"
    assert raw == snapshot


@given(st.dictionaries(st.sampled_from(["tool_id", "version", "executor_id", "executor",
                                        "parameters", "config"]),
                       st.one_of(st.none(), st.text(max_size=5), st.integers())))
def test_normalise_is_idempotent(raw: dict) -> None:
    once = normalise_manifest(raw)
    assert normalise_manifest(once) == once


def test_frontmatter_is_split_from_the_body() -> None:
    assert split_frontmatter("---\na: 1\n---\n# Title\n") == ("a: 1\n", "# Title\n")


def test_text_without_closing_fence_has_no_frontmatter() -> None:
    assert split_frontmatter("---\na: 1\n# Title\n")[0] is None
