"""Compiled JSON Schema validators, cached by the schema's canonical bytes.

Schemas are immutable data in manifests; compiling one costs far more than using it,
so every place that validates against a manifest schema goes through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import rfc8785
from jsonschema import Draft202012Validator, FormatChecker

_FORMAT_CHECKER = FormatChecker()


@lru_cache(maxsize=4096)
def _compile(canonical: bytes) -> Draft202012Validator:
    import json

    schema = json.loads(canonical)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=_FORMAT_CHECKER)


_BY_ID: dict[int, tuple[Mapping[str, Any], Draft202012Validator]] = {}


def validator_for(schema: Mapping[str, Any]) -> Draft202012Validator:
    """A compiled Draft 2020-12 validator (format checking on) for `schema`.

    A fast identity lookup avoids re-canonicalising the same schema object; the
    canonical-bytes cache makes equal schemas share one compiled validator.
    """
    hit = _BY_ID.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    validator = _compile(rfc8785.dumps(schema))
    if len(_BY_ID) > 4096:
        _BY_ID.clear()
    _BY_ID[id(schema)] = (schema, validator)
    return validator
