"""What a spare PID 1 of the namespace launcher may make ahead of its request, and what
its request then carries."""

from __future__ import annotations

import json

import pytest

from consumers.primitives.launcher_program import check_request, layout_of, run_message

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


REQUEST = {"id": 7, "argv": ["python3", "main.py"], "env": {"PATH": "/usr/bin"}, "cwd": "/tmp/r",
           "uid": 200001, "gid": 200001, "rlimits": [[9, 1, 1]],
           "system": [["ro_bind", "/usr", "/usr"], ["proc", "/proc"]],
           "mounts": [TMPFS, ["ro_bind", "/srv/tree/main.py", "/tmp/r/main.py"]]}


def test_a_pid_1_is_sent_its_run_without_the_system_part_it_made_ahead() -> None:
    attached = [TMPFS, ["tree", 0, "/tmp/r/main.py", 0]]
    message = json.loads(run_message(REQUEST, attached))
    assert "system" not in message and message["mounts"] == attached
    assert message == {key: value for key, value in REQUEST.items() if key != "system"} | {
        "mounts": attached}
    check_request(message, system=False)
    with pytest.raises(ValueError, match="system"):
        check_request(message)  # the executor's own request must carry it


@pytest.mark.parametrize("hostile", [{"uid": 0}, {"argv": []}, {"mounts": [[{"x": 1}]]},
                                     {"cwd": "relative"}])
def test_a_pid_1_still_refuses_a_malformed_run(hostile: dict[str, object]) -> None:
    message = json.loads(run_message(REQUEST | hostile, (REQUEST | hostile)["mounts"]))
    with pytest.raises(ValueError):
        check_request(message, system=False)
