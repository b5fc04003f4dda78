"""What bubblewrap runs share: the /etc view kept in step with its source, and tool
trees that are reused only while every file is still the verified one."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from consumers.primitives.bubblewrap import Confinement, MountStep, system_mounts
from consumers.primitives.file_store import ContentStore
from consumers.primitives.sandbox_cache import EtcView, ToolTrees, remove_orphans
from domain.errors import IntegrityMismatch
from domain.model import ToolFile

pytestmark = pytest.mark.integration


def tool_file(content: bytes, path: str = "main.py") -> ToolFile:
    return ToolFile(path, hashlib.sha256(content).hexdigest(), False, content)


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    source = tmp_path / "etc"
    source.mkdir()
    (source / "hosts").write_text("127.0.0.1 localhost\n")
    os.chmod(source / "hosts", 0o640)
    (source / "ssl").mkdir()
    (source / "zone").write_text("UTC\n")
    (source / "localtime").symlink_to(source / "zone")
    return source


def test_the_view_copies_files_follows_links_and_leaves_folders_to_bind(
        etc: Path, tmp_path: Path) -> None:
    view = EtcView(tmp_path / "view", ["hosts", "ssl", "localtime", "absent"], source=etc)
    assert view.refresh() == ("ssl",)
    assert (view.path / "hosts").read_text() == "127.0.0.1 localhost\n"
    assert stat.S_IMODE(os.stat(view.path / "hosts").st_mode) == 0o640
    assert not (view.path / "localtime").is_symlink()
    assert (view.path / "localtime").read_text() == "UTC\n"
    assert (view.path / "ssl").is_dir() and list((view.path / "ssl").iterdir()) == []
    assert not (view.path / "absent").exists()


def test_the_view_follows_changes_of_its_source(etc: Path, tmp_path: Path) -> None:
    view = EtcView(tmp_path / "view", ["hosts", "ssl", "new"], source=etc)
    view.refresh()
    (etc / "hosts").write_text("10.0.0.1 changed-and-longer\n")
    (etc / "new").write_text("appeared\n")
    (etc / "ssl").rmdir()
    (etc / "ssl").write_text("now a file\n")
    assert view.refresh() == ()
    assert (view.path / "hosts").read_text() == "10.0.0.1 changed-and-longer\n"
    assert (view.path / "new").read_text() == "appeared\n"
    assert (view.path / "ssl").read_text() == "now a file\n"
    (etc / "new").unlink()
    view.refresh()
    assert not (view.path / "new").exists()


def test_the_view_copies_nothing_while_its_source_is_unchanged_and_sees_every_change(
        etc: Path, tmp_path: Path) -> None:
    view = EtcView(tmp_path / "view", ["hosts", "localtime"], source=etc)
    view.refresh()
    copied = os.stat(view.path / "hosts").st_ino
    assert view.refresh() == () and os.stat(view.path / "hosts").st_ino == copied
    before = (etc / "hosts").stat().st_mtime_ns
    (etc / "hosts").write_text("127.0.0.2 localhost\n")  # in place, the same size
    os.utime(etc / "hosts", ns=(before + 10**9, before + 10**9))  # past coarse clocks
    view.refresh()
    assert (view.path / "hosts").read_text() == "127.0.0.2 localhost\n"
    (etc / "other-zone").write_text("Europe/Paris\n")
    (etc / "localtime").unlink()
    (etc / "localtime").symlink_to(etc / "other-zone")  # a link pointed elsewhere
    view.refresh()
    assert (view.path / "localtime").read_text() == "Europe/Paris\n"


def test_the_system_mounts_follow_the_view_they_are_made_from(tmp_path: Path) -> None:
    def plan(binds: tuple[str, ...]) -> list[MountStep]:
        return system_mounts(Confinement(etc_view=tmp_path, etc_binds=binds))

    assert ("ro_bind_try", "/etc/ssl", "/etc/ssl") not in plan(())
    assert ("ro_bind_try", "/etc/ssl", "/etc/ssl") in plan(("ssl",))
    assert ("ro_bind_try", "/etc/ssl", "/etc/ssl") not in plan(())
    assert ("ro_bind", str(tmp_path), "/etc") in plan(())
    assert ("ro_bind", str(tmp_path / "x"), "/etc") in system_mounts(
        Confinement(etc_view=tmp_path / "x"))
    changed = plan(())
    changed.append(("proc", "/elsewhere"))  # a caller's copy: the next plan is whole
    assert ("proc", "/elsewhere") not in plan(())


def test_a_tree_is_reused_while_intact(tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "cas")
    trees = ToolTrees(tmp_path / "trees")
    trees.root.mkdir()
    files = (tool_file(b"print('hi')\n"), tool_file(b"data", "pkg/data.txt"))
    first = trees.lease(store, files)
    second = trees.lease(store, files)
    assert first == second
    assert (first / "pkg" / "data.txt").read_bytes() == b"data"
    trees.release(first)
    trees.release(second)
    other = trees.lease(store, (tool_file(b"print('other')\n"),))
    assert other != first


def test_a_changed_tree_file_gets_a_new_tree_and_the_old_goes_with_its_last_run(
        tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "cas")
    trees = ToolTrees(tmp_path / "trees")
    trees.root.mkdir()
    files = (tool_file(b"print('hi')\n"),)
    first = trees.lease(store, files)
    target = first / "main.py"
    os.chmod(target, 0o644)  # what a tool running as root could do to a shared inode
    with open(target, "ab") as handle:
        handle.write(b"evil()\n")
    second = trees.lease(store, files)
    assert second != first
    assert (second / "main.py").read_bytes() == b"print('hi')\n"
    assert first.exists()  # still leased by the first run
    trees.release(first)
    assert not first.exists()


def test_a_tree_is_kept_when_only_a_link_to_its_files_came_or_went(tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "cas")
    trees = ToolTrees(tmp_path / "trees")
    trees.root.mkdir()
    files = (tool_file(b"print('hi')\n"),)
    first = trees.lease(store, files)
    trees.release(first)
    host_run = tmp_path / "host-run"  # a run in a host folder links the same objects
    host_run.mkdir()
    store.materialise(files, host_run)
    assert (host_run / "main.py").stat().st_ino == (first / "main.py").stat().st_ino
    (host_run / "main.py").unlink()
    assert trees.lease(store, files) == first


def test_bytes_changed_behind_a_restored_size_and_mtime_get_a_new_tree(
        tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "cas")
    trees = ToolTrees(tmp_path / "trees")
    trees.root.mkdir()
    files = (tool_file(b"print('hi')\n"),)
    first = trees.lease(store, files)
    trees.release(first)
    target = first / "main.py"
    before = target.stat()
    os.chmod(target, 0o644)  # what a tool running as root could do to a shared inode
    target.write_bytes(b"print('ho')\n")
    os.chmod(target, stat.S_IMODE(before.st_mode))
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    second = trees.lease(store, files)
    assert second != first
    assert (second / "main.py").read_bytes() == b"print('hi')\n"


def test_tampered_content_is_refused_even_when_a_tree_exists(tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "cas")
    trees = ToolTrees(tmp_path / "trees")
    trees.root.mkdir()
    good = tool_file(b"print('hi')\n")
    trees.release(trees.lease(store, (good,)))
    bad = ToolFile(good.path, good.sha256, False, b"print('evil')\n")
    with pytest.raises(IntegrityMismatch):
        trees.lease(store, (bad,))


def test_unused_trees_beyond_the_bound_are_removed(tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "cas")
    trees = ToolTrees(tmp_path / "trees", keep=2)
    trees.root.mkdir()
    made = []
    for n in range(4):
        tree = trees.lease(store, (tool_file(f"print({n})\n".encode()),))
        trees.release(tree)
        made.append(tree)
    assert [tree.exists() for tree in made] == [False, False, True, True]


def test_folders_of_killed_executors_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    orphan = tmp_path / f"toolexec-sandbox-{gone.stdout.strip()}-abc"
    live = tmp_path / f"toolexec-sandbox-{os.getpid()}-def"
    other = tmp_path / "toolexec-sandbox-notapid-ghi"
    for folder in (orphan, live, other):
        (folder / "etc").mkdir(parents=True)
    remove_orphans(tmp_path)
    assert not orphan.exists()
    assert live.exists() and other.exists()
