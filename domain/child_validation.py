"""Parent -> child validation along a chain.

A chain is ordered leaf..primitive; for each adjacent pair (child, parent) the parent's
`validation.child_schemas` — a list of `{match, schema}` — decides: the first entry whose
`match` keys all equal the child document's values gives the JSON Schema (Draft 2020-12)
the child document must satisfy.

The child document is
`{tool_id, version, tool_type, executor, manifest, config, files: [{path, sha256,
is_executable}]}` where `manifest` is the child's full manifest with its script details
lifted to the top: the keys of a nested `manifest:` block (the seed's form: language,
entrypoint, requires) and, when absent there, `language`/`entrypoint`/`requires` from
`config`. So a runtime's schema can say `properties.manifest.properties.entrypoint`
whichever form the script author used.

A parent without child schemas is an error in strict mode and a warning otherwise; a
parent with schemas none of which matches the child is always an error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from jsonschema import SchemaError

from domain.errors import ChainInvalid
from domain.model import Issue, ResolvedChain, ToolVersion
from domain.schema_cache import validator_for
from domain.validation import schema_issues

SCRIPT_DETAIL_KEYS: tuple[str, ...] = ("language", "entrypoint", "requires")

Outcome = tuple[tuple[Issue, ...], tuple[str, ...]]
_RESULTS: OrderedDict[tuple[str, str, bool], Outcome] = OrderedDict()
_RESULTS_MAX = 4096


def child_document(child: ToolVersion) -> dict[str, Any]:
    """The document a parent's child schema validates (see module docstring)."""
    manifest = child.manifest
    config = manifest.get("config")
    config = dict(config) if isinstance(config, Mapping) else {}
    return {
        "tool_id": child.tool_id,
        "version": child.version,
        "tool_type": child.tool_type,
        "executor": manifest.get("executor"),
        "manifest": _lifted_manifest(manifest, config),
        "config": config,
        "files": [{"path": f.path, "sha256": f.sha256, "is_executable": f.is_executable}
                  for f in sorted(child.files, key=lambda f: f.path)],
    }


def validate_pair(child: ToolVersion, parent: ToolVersion, *,
                  strict: bool = False) -> tuple[list[Issue], list[str]]:
    """Let `parent` validate `child`: (error issues, warnings).

    Cached per the pair's integrities, which identify their content once verified
    (verify the chain's integrity first, as the resolver does).
    """
    key = (parent.integrity, child.integrity, strict)
    hit = _RESULTS.get(key)
    if hit is None:
        hit = _validate_pair(child, parent, strict)
        _RESULTS[key] = hit
        if len(_RESULTS) > _RESULTS_MAX:
            _RESULTS.popitem(last=False)
    return list(hit[0]), list(hit[1])


def validate_chain(chain: ResolvedChain | Sequence[ToolVersion], *,
                   strict: bool) -> tuple[list[Issue], list[str]]:
    """Validate every adjacent (child, parent) pair of a leaf..primitive chain."""
    links = chain.links if isinstance(chain, ResolvedChain) else tuple(chain)
    issues: list[Issue] = []
    warnings: list[str] = []
    for child, parent in zip(links, links[1:], strict=False):
        pair_issues, pair_warnings = validate_pair(child, parent, strict=strict)
        issues.extend(pair_issues)
        warnings.extend(pair_warnings)
    return issues, warnings


def ensure_chain_valid(chain: ResolvedChain | Sequence[ToolVersion], *,
                       strict: bool = False) -> list[str]:
    """Validate the chain; return its warnings or raise ChainInvalid (E3105) listing
    every issue in `details["issues"]`."""
    issues, warnings = validate_chain(chain, strict=strict)
    if issues:
        raise ChainInvalid(
            f"chain rejected by parent schemas: {issues[0].message}"
            + (f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""),
            details={"issues": [issue.to_dict() for issue in issues]},
        )
    return warnings


def _validate_pair(child: ToolVersion, parent: ToolVersion, strict: bool) -> Outcome:
    who = f"{parent.tool_id}@{parent.version}"
    whom = f"{child.tool_id}@{child.version}"
    entries = _child_schemas(parent)
    if not entries:
        message = f"{who} defines no validation.child_schemas to validate child {whom}"
        return ((Issue("$", message),), ()) if strict else ((), (message,))
    document = child_document(child)
    for index, entry in enumerate(entries):
        if _matches(document, entry.get("match")):
            return _check(document, entry.get("schema"), f"{who} rejects {whom}", index), ()
    message = (f"{who} has no child schema matching {whom} "
               f"(tool_type {child.tool_type or 'missing'})")
    return (Issue("$", message),), ()


def _check(document: Mapping[str, Any], schema: Any, prefix: str, index: int) -> tuple[Issue, ...]:
    if not isinstance(schema, Mapping):
        return (Issue("$", f"{prefix}: child_schemas[{index}].schema is not an object"),)
    try:
        validator = validator_for(schema)
    except SchemaError as error:
        return (Issue("$", f"{prefix}: child_schemas[{index}].schema is not a valid "
                           f"JSON Schema: {error.message}"),)
    found = schema_issues(validator.iter_errors(document))
    return tuple(Issue(i.path, f"{prefix}: {i.path}: {i.message}") for i in found)


def _child_schemas(parent: ToolVersion) -> list[Mapping[str, Any]]:
    validation = parent.manifest.get("validation")
    if not isinstance(validation, Mapping):
        return []
    entries = validation.get("child_schemas")
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        return []
    return [entry for entry in entries if isinstance(entry, Mapping)]


def _matches(document: Mapping[str, Any], criteria: Any) -> bool:
    if criteria is None:
        return True
    if not isinstance(criteria, Mapping):
        return False
    return all(key in document and document[key] == value for key, value in criteria.items())


def _lifted_manifest(manifest: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    lifted = dict(manifest)
    details = manifest.get("manifest")
    if isinstance(details, Mapping):
        for key, value in details.items():
            lifted.setdefault(key, value)
    for key in SCRIPT_DETAIL_KEYS:
        if key not in lifted and key in config:
            lifted[key] = config[key]
    return lifted
