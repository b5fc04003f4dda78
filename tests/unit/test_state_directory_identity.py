"""A state directory is the one a process started on only while its path names it."""

from __future__ import annotations

import shutil
from pathlib import Path

from toolexec.state_files import DirectoryIdentity


def test_the_same_directory_is_still_there(tmp_path: Path) -> None:
    state = tmp_path / ".toolexec"
    state.mkdir()
    identity = DirectoryIdentity(state)
    (state / "file").write_text("changes inside do not matter")
    assert identity.still_there()
    identity.close()


def test_a_deleted_moved_or_replaced_directory_is_not(tmp_path: Path) -> None:
    state = tmp_path / ".toolexec"
    state.mkdir()
    identity = DirectoryIdentity(state)

    state.rename(tmp_path / "moved")
    assert not identity.still_there()
    (tmp_path / "moved").rename(state)
    assert identity.still_there()  # put back: the very same directory

    shutil.rmtree(state)
    assert not identity.still_there()
    state.mkdir()  # made again (never with the held inode), or a backup put back
    assert not identity.still_there()

    shutil.rmtree(state)
    state.write_text("a file where the directory was")
    assert not identity.still_there()
    identity.close()
