"""Semantic versions and npm-style ranges (`^1.2.0`, `~1.1`, `>=1 <2`, `1.x`, `*`,
exact versions, `a || b`), with npm's prerelease rule: a prerelease version satisfies a
range only when the range names a prerelease of the same major.minor.patch.

Parsing is delegated to `semantic_version.NpmSpec`; parsed ranges are cached because the
same few ranges are asked for on every invocation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import semantic_version

from domain.errors import RequestError

ANY_RANGE = "*"
# "latest" is what people type for "the newest"; for ranges it means "*".
_ALIASES = {"": ANY_RANGE, "latest": ANY_RANGE}


@dataclass(frozen=True, slots=True)
class Range:
    """A parsed version range. `text` is the range as written (after trimming)."""

    text: str
    spec: semantic_version.NpmSpec

    def matches(self, version: str) -> bool:
        """True when `version` is valid semver and satisfies the range."""
        parsed = parse_version(version)
        return parsed is not None and parsed in self.spec


def is_valid_version(text: str) -> bool:
    """True for a strict semantic version `MAJOR.MINOR.PATCH[-pre][+build]`."""
    return parse_version(text) is not None


@lru_cache(maxsize=4096)
def parse_version(text: str) -> semantic_version.Version | None:
    """The parsed version, or None when `text` is not strict semver."""
    if not isinstance(text, str):
        return None
    try:
        return semantic_version.Version(text)
    except ValueError:
        return None


def parse_range(text: str) -> Range:
    """Parse an npm-style range. Raises RequestError (E3004) naming the bad range."""
    if not isinstance(text, str):
        raise RequestError(f"a version range must be a string, got {type(text).__name__}",
                           details={"range": repr(text)})
    return _parse_range(text.strip())


@lru_cache(maxsize=1024)
def _parse_range(text: str) -> Range:
    try:
        spec = semantic_version.NpmSpec(_ALIASES.get(text, text))
    except ValueError as error:
        raise RequestError(
            f"invalid version range {text!r}: expected an npm-style range such as "
            "'1.2.3', '^1.2.0', '~1.1', '>=1 <2', '1.x', '*' or 'a || b'",
            details={"range": text, "reason": str(error)},
        ) from error
    return Range(text=text, spec=spec)


def select_highest(versions: Iterable[str], range_text: str) -> str | None:
    """The highest version in `versions` satisfying `range_text`, or None.

    Invalid version strings are ignored; prereleases are considered only when the range
    names a prerelease (npm semantics, as NpmSpec implements them).
    """
    spec = parse_range(range_text).spec
    best: tuple[semantic_version.Version, str] | None = None
    for text in versions:
        parsed = parse_version(text)
        if parsed is None or parsed not in spec:
            continue
        if best is None or parsed > best[0]:
            best = (parsed, text)
    return None if best is None else best[1]


def sort_versions(versions: Iterable[str]) -> list[str]:
    """Valid versions in ascending semver order (invalid ones last, as given)."""
    items = list(versions)
    valid = sorted((v for v in items if parse_version(v) is not None), key=parse_version)
    return valid + [v for v in items if parse_version(v) is None]
