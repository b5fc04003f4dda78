"""What an invocation request may carry: strict JSON within a size bound.

Parameters travel in `tool.invoke.requested` and in the events derived from it, and
reach the tool verbatim, so they must be JSON every consumer reads the same way:
no NaN or Infinity (Python reads them, JSON does not, pydantic writes them as null),
no lone UTF-16 surrogates (they cannot be encoded as UTF-8, so producing the next
event fails), nesting within a bound, and a compact encoding no larger than the
operator's limit. The gateway, `toolexec run` and the pipeline (for requests any
Kafka producer wrote) all apply `check_request_payload`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from domain.errors import InvalidRequest

DEFAULT_MAX_PARAMETER_BYTES: Final = 256 * 1024
MAX_JSON_DEPTH: Final = 64
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class PayloadRejected(InvalidRequest):
    """Request data that is not strict JSON or is too large (E3004). `too_large` tells
    an HTTP gateway to answer 413 rather than 422."""

    code = "E3004"

    @property
    def too_large(self) -> bool:
        return self.details.get("reason") == "too_large"


def json_issue(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> PayloadRejected | None:
    """The first reason `value` is not strict JSON (NaN/Infinity, a lone surrogate, a
    non-string key, a value JSON has no type for, nesting past `max_depth`), with the
    JSON path where it was found; None when it is strict JSON."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > max_depth:
            return _rejected("too_deep", path, f"nesting deeper than {max_depth} levels")
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return _rejected("lone_surrogate", path, "a string holds a lone UTF-16 "
                                 "surrogate (not valid Unicode text)")
        elif isinstance(node, bool) or node is None or isinstance(node, int):
            continue
        elif isinstance(node, float):
            if not math.isfinite(node):
                return _rejected("non_finite_number", path, f"{node!r} is not a JSON number")
        elif isinstance(node, Mapping):
            for key, item in node.items():
                if not isinstance(key, str):
                    return _rejected("non_string_key", path, "object keys must be strings")
                if _SURROGATE.search(key):
                    return _rejected("lone_surrogate", path, "an object key holds a lone "
                                     "UTF-16 surrogate")
                stack.append((item, f"{path}.{key}", depth + 1))
        elif isinstance(node, list | tuple):
            stack.extend((item, f"{path}[{index}]", depth + 1)
                         for index, item in enumerate(node))
        else:
            return _rejected("not_json", path, f"a {type(node).__name__} is not a JSON value")
    return None


def encoded_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON (what a record carries)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode("utf-8"))


def check_request_payload(parameters: Any, *, lockfile: Any = None,
                          max_bytes: int = DEFAULT_MAX_PARAMETER_BYTES) -> None:
    """Raise PayloadRejected (E3004) unless `parameters` (and `lockfile`, when given)
    are strict JSON and their compact encoding, together, fits in `max_bytes`."""
    for name, value in (("parameters", parameters), ("lockfile", lockfile)):
        issue = json_issue(value)
        if issue is not None:
            raise PayloadRejected(f"{name}: {issue.message}",
                                  details={**issue.details, "field": name})
    size = encoded_size(parameters) + (0 if lockfile is None else encoded_size(lockfile))
    if size > max_bytes:
        raise PayloadRejected(
            f"parameters take {size} bytes as JSON, more than the {max_bytes}-byte limit",
            details={"reason": "too_large", "max": max_bytes, "actual": size})


def strict_json_loads(text: str | bytes) -> Any:
    """Parse JSON as RFC 8259 has it: NaN, Infinity and lone surrogates are refused
    (PayloadRejected, E3004), like text that is not JSON."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except PayloadRejected:
        raise
    except RecursionError:
        raise _rejected("too_deep", "$", "nesting too deep") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise PayloadRejected(f"not JSON: {error}", details={"reason": "not_json"}) from None
    issue = json_issue(value)
    if issue is not None:
        raise issue
    return value


def _refuse_constant(name: str) -> Any:
    raise _rejected("non_finite_number", "$", f"{name} is not a JSON number")


def _rejected(reason: str, path: str, message: str) -> PayloadRejected:
    return PayloadRejected(f"{message} at {path}", details={"reason": reason, "path": path})
