"""A rebuild share runs without automatic garbage collections (after each step it
collects that step's young objects once and sets the survivors aside), and its
workers' fork server preloads what the main script imports."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from projections import rebuild_workers
from projections.runner import RunnerStats


class _Node:
    """A container the collector tracks; `ring` makes it a cycle."""

    def __init__(self) -> None:
        self.ring: Any = self


def _tracked(obj: object) -> bool:
    """Whether `obj` is in one of the collector's generations (frozen ones are not)."""
    return any(o is obj for o in gc.get_objects())


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_no_automatic_collection_inside_and_each_settle_frees_the_cycles_left() -> None:
    gc.enable()
    with rebuild_workers._collected_between_steps() as settle:
        assert not gc.isenabled()
        garbage = _Node()
        dead = weakref.ref(garbage)
        del garbage
        for _ in range(50_000):  # far past any automatic collection's threshold
            _Node()
        assert dead() is not None
        kept = _Node()
        settle()
        assert dead() is None  # the step's cycle is freed when it ends
        assert not _tracked(kept)  # the survivor is set aside, scanned no more
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert _tracked(kept)  # handed back to the collector


def test_collections_left_off_before_a_share_stay_off_after_it() -> None:
    gc.disable()
    with rebuild_workers._collected_between_steps() as settle:
        settle()
    assert not gc.isenabled()


class _FakeRunner:
    """A runner of three steps, each leaving a cycle behind; records what the
    collector looked like while it stepped."""

    seen: list[tuple[bool, bool]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.model_stats: dict[str, RunnerStats] = {}
        self.stats = RunnerStats()
        self._steps = 0
        self._previous: weakref.ref[_Node] | None = None

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def reached(self, targets: Any) -> bool:
        return self._steps >= 3

    async def step(self) -> int:
        previous_freed = self._previous is None or self._previous() is None
        _FakeRunner.seen.append((gc.isenabled(), previous_freed))
        node = _Node()
        self._previous = weakref.ref(node)
        self._steps += 1
        self.stats.records += 1
        return 1


async def test_a_share_steps_without_collections_and_frees_each_steps_cycles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gc.enable()
    _FakeRunner.seen = []
    monkeypatch.setattr(rebuild_workers, "ProjectionRunner", _FakeRunner)
    result = await rebuild_workers.run_share(object(), [], "127.0.0.1:9",  # type: ignore[arg-type]
                                             partitions=None, ends={})
    assert result.records == 3
    assert _FakeRunner.seen == [(False, True)] * 3
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_the_fork_server_preloads_the_modules_the_main_script_took_names_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import collections
    import json
    import types

    class _NotImported:
        __module__ = "toolexec_not_a_module_anywhere"

    main = types.ModuleType("__main__")
    main.__dict__.update(dumps=json.dumps, collections=collections, length=len,
                         stranger=_NotImported(), number=3)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert rebuild_workers.preloaded_modules() == [*rebuild_workers.WORKER_MODULES,
                                                   "collections", "json"]
