"""The one rule for a path inside a tool: relative, POSIX, never leaving the tool's root.

Used wherever a path comes from a manifest, a request or a published file: entrypoints
(validation), paths a manifest hands to a primitive (plans), files of a registered
tool (the HTTP gateway). Pure: no I/O.
"""

from __future__ import annotations

import re

_DRIVE = re.compile(r"^[A-Za-z]:")


def relative_parts(path: str, *, allow_root: bool = False) -> tuple[str, ...] | None:
    """The components of `path` relative to a tool's root, `.` and empty components
    dropped; None when it is not such a path: absolute, with a drive letter, a
    backslash, a NUL byte or a `..` component, or (unless `allow_root`) naming the
    root itself."""
    if not isinstance(path, str) or "\x00" in path or "\\" in path:
        return None
    if path.startswith("/") or _DRIVE.match(path):
        return None
    parts = tuple(part for part in path.split("/") if part not in ("", "."))
    if ".." in parts or (not parts and not allow_root):
        return None
    return parts


def canonical_relative(path: str) -> bool:
    """Whether `path` is a relative path inside the root written in its one canonical
    form (`a/b.py`: no `.`, empty or `..` component), as published files are."""
    parts = relative_parts(path)
    return parts is not None and "/".join(parts) == path
