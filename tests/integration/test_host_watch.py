"""The sandbox cache's HostWatch: a verification lasts exactly until something it relied
on changes (inotify on real files), and without a watch every check is made again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from consumers.primitives.host_watch import HostWatch, WatchedAnswers
from consumers.primitives.sandbox_cache import EtcView

pytestmark = pytest.mark.integration


def replace_with(other: Path, target: Path) -> None:
    other.write_text("new bytes")
    os.replace(other, target)


@pytest.fixture
def watch() -> HostWatch:
    made = HostWatch()
    yield made
    made.close()


def test_a_moment_lasts_until_a_watched_file_changes_in_any_way(
        tmp_path: Path, watch: HostWatch) -> None:
    target = tmp_path / "file"
    target.write_text("one")
    changes = [
        lambda: target.write_text("two"),
        lambda: os.chmod(target, 0o600),
        lambda: os.utime(target, ns=(1, 1)),
        lambda: os.link(target, tmp_path / "second-name"),
        lambda: replace_with(tmp_path / "other", target),
        lambda: target.unlink(),
        lambda: target.write_text("back"),
    ]
    for change in changes:
        moment = watch.moment(watch.watch([str(target)]))
        assert watch.unchanged(moment) and watch.unchanged(moment)
        change()
        assert not watch.unchanged(moment)


def test_a_link_pointed_elsewhere_and_a_folder_swapped_on_its_way_are_changes(
        tmp_path: Path, watch: HostWatch) -> None:
    (tmp_path / "zones" / "a").mkdir(parents=True)
    (tmp_path / "zones" / "a" / "zone").write_text("UTC")
    (tmp_path / "zones" / "b").mkdir()
    (tmp_path / "zones" / "b" / "zone").write_text("CET")
    (tmp_path / "current").symlink_to(tmp_path / "zones" / "a")
    link = tmp_path / "etc" / "localtime"
    link.parent.mkdir()
    link.symlink_to(tmp_path / "current" / "zone")

    moment = watch.moment(watch.watch([str(link)], ancestors=True))
    (tmp_path / "current").unlink()  # the folder on the link's way, not the link
    (tmp_path / "current").symlink_to(tmp_path / "zones" / "b")
    assert not watch.unchanged(moment)

    moment = watch.moment(watch.watch([str(link)], ancestors=True))
    link.unlink()
    link.symlink_to(tmp_path / "zones" / "a" / "zone")
    assert not watch.unchanged(moment)


def test_a_file_appearing_where_a_watched_one_was_absent_is_a_change(
        tmp_path: Path, watch: HostWatch) -> None:
    moment = watch.moment(watch.watch([str(tmp_path / "absent")]))
    (tmp_path / "absent").write_text("here now")
    assert not watch.unchanged(moment)


def test_changes_beside_a_watched_path_end_only_the_tokens_that_rely_on_them(
        tmp_path: Path, watch: HostWatch) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "object").write_text("bytes")
    (tmp_path / "other").write_text("x")
    relying = watch.moment(watch.watch([str(tmp_path / "store" / "object")], ancestors=True))
    beside = watch.moment(watch.watch([str(tmp_path / "other")]))
    for number in range(3):  # a busy folder above: other names come and go
        (tmp_path / f"temporary-{number}").write_text("x")
        (tmp_path / f"temporary-{number}").unlink()
    (tmp_path / "store" / "another-object").write_text("y")
    assert watch.unchanged(relying)
    (tmp_path / "other").write_text("changed")
    assert watch.unchanged(relying) and not watch.unchanged(beside)
    (tmp_path / "store").rename(tmp_path / "moved")
    assert not watch.unchanged(relying)


def test_without_a_watch_nothing_is_ever_unchanged(tmp_path: Path) -> None:
    closed = HostWatch()
    closed.close()
    assert closed.watch([str(tmp_path)]) is None
    assert closed.moment(closed.watch([str(tmp_path)])) is None
    assert not closed.unchanged(None)


def test_an_answer_is_kept_until_what_it_was_computed_from_changes(
        tmp_path: Path, watch: HostWatch) -> None:
    target = tmp_path / "program"
    target.write_text("v1")
    computed: list[str] = []

    def read() -> str:
        computed.append(target.read_text())
        return computed[-1]

    answers: WatchedAnswers[str] = WatchedAnswers(watch)
    assert answers.get("program", read, lambda _answer: [str(target)]) == "v1"
    calls = len(computed)
    assert answers.get("program", read, lambda _answer: [str(target)]) == "v1"
    assert len(computed) == calls  # served from the watch, not computed again
    target.write_text("v2")
    assert answers.get("program", read, lambda _answer: [str(target)]) == "v2"


def test_an_answer_of_paths_that_cannot_be_watched_is_computed_every_time(
        tmp_path: Path) -> None:
    closed = HostWatch()
    closed.close()
    computed: list[int] = []
    answers: WatchedAnswers[int] = WatchedAnswers(closed)
    for _ in range(3):
        answers.get("key", lambda: computed.append(1) or len(computed), lambda _a: [])
    assert len(computed) == 3


def test_the_etc_view_without_a_watch_still_follows_every_change(tmp_path: Path) -> None:
    source = tmp_path / "etc"
    source.mkdir()
    (source / "hosts").write_text("127.0.0.1 localhost\n")
    closed = HostWatch()
    closed.close()
    view = EtcView(tmp_path / "view", ["hosts"], source=source, watch=closed)
    view.refresh()
    (source / "hosts").write_text("10.0.0.1 changed\n")
    view.refresh()
    assert (view.path / "hosts").read_text() == "10.0.0.1 changed\n"


def test_the_etc_view_sees_a_change_made_right_after_a_check_it_skipped(
        tmp_path: Path) -> None:
    source = tmp_path / "etc"
    source.mkdir()
    (source / "hosts").write_text("127.0.0.1 localhost\n")
    view = EtcView(tmp_path / "view", ["hosts"], source=source)
    for round_number in range(5):
        view.refresh()
        view.refresh()  # nothing changed: the check is skipped
        (source / "hosts").write_text(f"10.0.0.{round_number} changed\n")
        view.refresh()
        assert (view.path / "hosts").read_text() == f"10.0.0.{round_number} changed\n"


def test_a_check_of_a_removed_file_is_never_trusted_again_until_watched_anew(
        tmp_path: Path, watch: HostWatch) -> None:
    target = tmp_path / "object"
    target.write_text("bytes")
    dependencies = watch.watch([str(target)])
    moment = watch.moment(dependencies)
    target.unlink()  # its inode goes, and the kernel drops its watch
    target.write_text("bytes")  # the same name and bytes, another inode
    assert not watch.unchanged(moment)
    assert watch.moment(dependencies) is None  # what relied on the old inode ends
    renewed = watch.moment(watch.watch([str(target)]))
    assert renewed is not None and watch.unchanged(renewed)


def test_a_renewed_token_holds_as_long_and_ends_on_the_same_changes(
        tmp_path: Path, watch: HostWatch) -> None:
    relied_on, beside = tmp_path / "relied-on", tmp_path / "beside"
    relied_on.write_text("one")
    beside.write_text("x")
    token = watch.moment(watch.watch([str(relied_on)]))
    other = watch.moment(watch.watch([str(beside)]))
    assert watch.renewed(token) is token  # nothing changed: the very same token
    beside.write_text("changed")  # a change the token does not rely on
    renewed = watch.renewed(token)
    assert renewed is not None and renewed is not token and watch.renewed(renewed) is renewed
    assert watch.renewed(other) is None
    relied_on.write_text("two")
    assert watch.renewed(renewed) is None and watch.renewed(token) is None
    assert not watch.unchanged(renewed)
