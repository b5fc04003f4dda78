"""The one safe-relative-path rule (domain/paths.py), used by validation, plans and the
HTTP gateway: whatever the text, an accepted path stays inside the tool's root."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.paths import canonical_relative, relative_parts

SEGMENTS = st.sampled_from(["a", "b.py", ".", "..", "", "x y", "C:", "\\", "\x00", "/"])


@given(st.lists(SEGMENTS, max_size=6).map("/".join) | st.text(max_size=30))
def test_an_accepted_path_never_leaves_the_root(path: str) -> None:
    parts = relative_parts(path, allow_root=True)
    if parts is None:
        return
    joined = "/".join(parts) or "."
    normal = posixpath.normpath(posixpath.join("/root", joined))
    assert normal == "/root" or normal.startswith("/root/")
    assert all(part not in ("", ".", "..") and "\\" not in part for part in parts)


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "a/..", "C:/x",
                                  "a\\b", "a\x00b", "", ".", "./"])
def test_paths_outside_or_ambiguous_are_refused(path: str) -> None:
    assert relative_parts(path) is None


@pytest.mark.parametrize(("path", "parts"), [("main.py", ("main.py",)),
                                             ("./src//main.py", ("src", "main.py"))])
def test_dot_and_empty_components_are_dropped(path: str, parts: tuple[str, ...]) -> None:
    assert relative_parts(path) == parts


def test_the_root_itself_only_when_allowed() -> None:
    assert relative_parts(".", allow_root=True) == ()


@pytest.mark.parametrize(("path", "canonical"), [("a/b.py", True), ("./a", False),
                                                 ("a//b", False), ("a/", False)])
def test_published_files_need_the_canonical_form(path: str, canonical: bool) -> None:
    assert canonical_relative(path) is canonical
