"""What a spare PID 1 of the namespace launcher may make ahead of its request."""

from __future__ import annotations

from consumers.primitives.launcher_program import layout_of

TMPFS = ["tmpfs", "/tmp", 1023, 1 << 30]


def test_a_tmpfs_and_the_folders_inside_it_are_the_layout() -> None:
    mounts = [TMPFS, ["dir", "/tmp/r", 457], ["dir", "/tmp/r/work", 511],
              ["tree", 0, "/tmp/r/work/main.py", 0], ["dir", "/tmp/r/late", 511]]
    assert layout_of(mounts) == mounts[:3]


def test_a_folder_outside_the_tmpfs_ends_the_layout() -> None:
    mounts = [TMPFS, ["dir", "/tmpother", 457], ["dir", "/tmp/r", 457]]
    assert layout_of(mounts) == [TMPFS]


def test_mounts_that_do_not_begin_with_a_tmpfs_have_no_layout() -> None:
    assert layout_of([]) == []
    assert layout_of([["dir", "/tmp/r", 457], TMPFS]) == []
    assert layout_of([["ro_bind", "/etc", "/tmp"]]) == []
    assert layout_of([["tmpfs"]]) == []
    assert layout_of([["tmpfs", 5, 1, 2]]) == []
    assert layout_of(["tmpfs"]) == []
