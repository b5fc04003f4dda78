"""JSON Merge Patch (RFC 7386): applying a patch, and computing one between two values.

A merge patch describes the change from one JSON object to another as an object of
the members that changed: a member set to `null` is removed, an object member is
patched recursively, anything else (arrays included) replaces what was there. Since
`null` means "remove", a target holding `null` inside an object cannot be reached by
a patch: `diff` says so by returning None, and its callers store the whole value.
"""

from __future__ import annotations

from typing import Any

_NO_PATCH = object()


def apply_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 MergePatch(target, patch): a new value, `target` is left unchanged."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = apply_patch(result.get(name), value)
    return result


def diff(source: Any, target: Any) -> Any:
    """A merge patch turning `source` into `target` (apply_patch(source, patch) equals
    `target` exactly, types included), or None when no merge patch can: `target` holds
    `null` as an object member, or is `null` itself."""
    patch = _diff(source, target)
    return None if patch is _NO_PATCH else patch


def _diff(source: Any, target: Any) -> Any:
    if not isinstance(target, dict):
        return _NO_PATCH if target is None else target
    if not isinstance(source, dict):
        return target if _null_free(target) else _NO_PATCH
    patch: dict[str, Any] = {name: None for name in source if name not in target}
    for name, value in target.items():
        if name in source and same(source[name], value):
            continue
        member = _diff(source.get(name), value)
        if member is _NO_PATCH:
            return _NO_PATCH
        patch[name] = member
    return patch


def _null_free(value: Any) -> bool:
    """No object inside `value` (outside arrays, which a patch replaces whole) holds null."""
    if not isinstance(value, dict):
        return True
    return all(member is not None and _null_free(member) for member in value.values())


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values of the same types (Python's `==` takes True for 1 and 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
