"""Kubernetes-style quantities in manifests and settings: sizes (`512Mi`) and CPU
(`500m`). Light on purpose: the settings read sizes at every command's start."""

from __future__ import annotations

import re
from typing import Any

from domain.errors import ChainInvalid

_SIZE = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?")
_SIZE_UNITS: dict[str, int] = {
    "": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4,
}
_CPU = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m?)")


def parse_size(text: Any, what: str = "size") -> int:
    """Bytes of a Kubernetes-style quantity: `512Mi`, `2Gi`, `100M`, or an integer."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise _invalid(f"{what} {text!r} is not a size such as '512Mi' or '2Gi'")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2) or ""]


def parse_cpu(text: Any, what: str = "cpu") -> float:
    """Cores of a Kubernetes-style CPU quantity: `500m` -> 0.5, `2` -> 2.0."""
    if isinstance(text, int | float) and not isinstance(text, bool) and text > 0:
        return float(text)
    match = _CPU.fullmatch(text) if isinstance(text, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise _invalid(f"{what} {text!r} is not a CPU quantity such as '500m' or '2'")
    value = float(match.group(1))
    return value / 1000 if match.group(2) else value


def _invalid(message: str) -> ChainInvalid:
    return ChainInvalid(message, details={"reason": message})
