"""Publications that would inflate past their limits: a sparse file that gzips to
~660 KB but holds 650 MB, tens of thousands of empty files, and the same bombs
written straight onto the log as `tool.published` events (an attacker with write
access to the registry topic skips the publisher). Each is refused with E3105
without being inflated, and the registry view keeps files compressed."""

from __future__ import annotations

import base64
import gzip
import hashlib
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest

from consumers.primitives.file_store import ContentStore
from contracts.envelope import new_envelope
from contracts.events import PublishedFile, ToolPublished
from domain.errors import RegistryError
from domain.model import ToolFile
from domain.publication_limits import PublicationTooLarge
from projections.registry_view import RegistryLogView
from tests.cli_process import toolexec
from toolexec.publishing import publish_event, record_size
from toolexec.sources import SourceError, load_source

pytestmark = pytest.mark.security

BOMB_BYTES = 650 * 1024 * 1024
NOW = datetime(2026, 1, 1, tzinfo=UTC)
T = TypeVar("T")

TOOL_YAML = """\
tool_id: {tool_id}
version: "1.0.0"
tool_type: script
executor: python_runtime
description: A tool whose files are a bomb.
config: {{entrypoint: main.py}}
"""


@pytest.fixture(scope="module")
def bomb() -> tuple[bytes, str]:
    """650 MB of zeros as one gzip member (~660 KB), and the sha256 of those zeros."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    digest = hashlib.sha256()
    zeros = bytes(1 << 20)
    parts = []
    for _ in range(BOMB_BYTES >> 20):
        parts.append(deflate.compress(zeros))
        digest.update(zeros)
    parts.append(deflate.flush())
    return b"".join(parts), digest.hexdigest()


def peak_of(action: Callable[[], T]) -> tuple[T | BaseException, int]:
    """What `action` returned or raised, and the peak of Python memory it allocated."""
    tracemalloc.start()
    try:
        try:
            outcome: T | BaseException = action()
        except Exception as error:  # noqa: BLE001 - the test looks at it
            outcome = error
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def script_tool(root: Path, tool_id: str) -> Path:
    tool = root / tool_id
    tool.mkdir(parents=True)
    (tool / "tool.yaml").write_text(TOOL_YAML.format(tool_id=tool_id))
    (tool / "main.py").write_text("print('{}')\n")
    return tool


def forged_publication(files: list[PublishedFile], tool_id: str = "bomb") -> ToolPublished:
    return ToolPublished(tool_id=tool_id, version="1.0.0", tool_type="script",
                         executor="python_runtime", manifest={"tool_id": tool_id},
                         files=files, integrity="sha256:" + "0" * 64)


def bomb_file(bomb: tuple[bytes, str], declared_size: int) -> PublishedFile:
    packed, sha = bomb
    return PublishedFile(path="data.bin", sha256=sha, is_executable=False,
                         size=declared_size, content_b64gz=base64.b64encode(packed).decode())


@pytest.fixture
def view() -> Iterator[RegistryLogView]:
    yield RegistryLogView()


def fold(view: RegistryLogView, data: ToolPublished) -> None:
    view.apply(new_envelope(data, source="urn:attacker", partitionkey=data.tool_id,
                            correlationid="x", id=f"forged-{data.tool_id}", time=NOW))


# ----------------------------------------------------------------------- publishing


def test_a_sparse_650_mb_file_is_refused_at_publish_without_being_read(tmp_path: Path) -> None:
    tool = script_tool(tmp_path, "sparse")
    with open(tool / "data.bin", "wb") as handle:
        handle.truncate(BOMB_BYTES)
    outcome, peak = peak_of(lambda: load_source(tool))
    assert isinstance(outcome, SourceError) and outcome.code == "E3105"
    assert "limit" in outcome.message
    assert peak < 32 * 1024 * 1024


def test_validate_names_the_sparse_file_limit(tmp_path: Path) -> None:
    tool = script_tool(tmp_path, "sparse_cli")
    with open(tool / "data.bin", "wb") as handle:
        handle.truncate(BOMB_BYTES)
    done = toolexec("validate", str(tool), "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert "E3105" in done.stdout and "byte limit" in done.stdout


def test_thirty_thousand_empty_files_are_e3105_not_a_producer_error(tmp_path: Path) -> None:
    tool = script_tool(tmp_path, "many")
    data = tool / "data"
    data.mkdir()
    for index in range(30_000):
        (data / f"{index}.txt").touch()
    with pytest.raises(SourceError, match="file limit") as caught:
        load_source(tool)
    assert caught.value.code == "E3105"


def test_a_publication_too_large_for_one_record_is_rejected_before_producing() -> None:
    from domain.model import ToolSource
    from domain.publication_limits import PublicationLimits

    files = tuple(ToolFile(f"f/{i}.txt", hashlib.sha256(b"").hexdigest(), False, b"")
                  for i in range(8000))
    source = ToolSource({"tool_id": "wide", "version": "1.0.0", "tool_type": "script",
                         "executor": "python_runtime", "parameters": {"type": "object"},
                         "config": {"entrypoint": "f/0.txt"}}, files, "test")
    event = publish_event(source, now=NOW, limits=PublicationLimits(max_files=10_000))
    assert event.type == "tool.publish.rejected"
    assert event.data.error.code == "E3105"
    assert "record" in event.data.error.message or "record" in str(event.data.issues)
    assert record_size(event) < 1024 * 1024  # the rejection itself fits in a record


# ----------------------------------------------------------- forged events on the log


def test_a_forged_publication_declaring_a_small_size_is_refused_after_one_chunk(
        bomb: tuple[bytes, str], view: RegistryLogView) -> None:
    outcome, peak = peak_of(lambda: fold(view, forged_publication([bomb_file(bomb, 100)])))
    assert not isinstance(outcome, BaseException), outcome  # the view logs and moves on
    assert view.get("bomb", "1.0.0") is None
    assert peak < 32 * 1024 * 1024


def test_a_forged_publication_declaring_its_real_size_is_refused_unread(
        bomb: tuple[bytes, str], view: RegistryLogView) -> None:
    outcome, peak = peak_of(lambda: fold(view, forged_publication([bomb_file(bomb,
                                                                             BOMB_BYTES)])))
    assert not isinstance(outcome, BaseException), outcome
    assert view.get("bomb", "1.0.0") is None
    assert peak < 32 * 1024 * 1024


def test_a_forged_publication_of_thirty_thousand_files_is_refused(view: RegistryLogView) -> None:
    empty = base64.b64encode(gzip.compress(b"", mtime=0)).decode()
    files = [PublishedFile(path=f"{i}.txt", sha256=hashlib.sha256(b"").hexdigest(),
                           is_executable=False, size=0, content_b64gz=empty)
             for i in range(30_000)]
    fold(view, forged_publication(files, tool_id="many"))
    assert view.get("many", "1.0.0") is None


def test_a_forged_file_whose_bytes_do_not_match_its_sha256_is_refused(
        view: RegistryLogView) -> None:
    content = b"print('hello')\n"
    file = PublishedFile(path="main.py", sha256="1" * 64, is_executable=False,
                         size=len(content),
                         content_b64gz=base64.b64encode(gzip.compress(content)).decode())
    fold(view, forged_publication([file], tool_id="liar"))
    assert view.get("liar", "1.0.0") is None


def test_the_registry_view_keeps_files_compressed(view: RegistryLogView) -> None:
    content = b"x = 1\n" * (5 * 1024 * 1024 // 6)  # 5 MB of source, a few KB of gzip
    file = PublishedFile(path="big.py", sha256=hashlib.sha256(content).hexdigest(),
                         is_executable=False, size=len(content),
                         content_b64gz=base64.b64encode(gzip.compress(content)).decode())
    events = [forged_publication([file], tool_id=f"big_{i}") for i in range(30)]
    tracemalloc.start()
    try:
        for data in events:
            fold(view, data)
        retained = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert all(view.get(f"big_{i}", "1.0.0") is not None for i in range(30))
    assert retained < 20 * 1024 * 1024  # 30 versions x 5 MB would be 150 MB inflated


# --------------------------------------------------------------------- materialising


def test_materialising_a_file_that_inflates_past_its_size_is_refused(
        bomb: tuple[bytes, str], tmp_path: Path) -> None:
    packed, sha = bomb
    file = ToolFile(path="data.bin", sha256=sha, packed=packed, size=1024)
    store = ContentStore(tmp_path / "cas")
    outcome, peak = peak_of(lambda: store.materialise([file], tmp_path / "run"))
    assert isinstance(outcome, PublicationTooLarge) and outcome.code == "E3105"
    assert peak < 32 * 1024 * 1024
    assert not (tmp_path / "run" / "data.bin").exists()


def test_materialising_a_compressed_file_writes_its_bytes(tmp_path: Path) -> None:
    content = b"#!/bin/sh\necho hi\n"
    file = ToolFile(path="run.sh", sha256=hashlib.sha256(content).hexdigest(),
                    is_executable=True, packed=gzip.compress(content), size=len(content))
    (tmp_path / "run").mkdir()
    ContentStore(tmp_path / "cas").materialise([file], tmp_path / "run")
    assert (tmp_path / "run" / "run.sh").read_bytes() == content


def test_materialising_a_compressed_file_with_other_bytes_is_refused(tmp_path: Path) -> None:
    file = ToolFile(path="main.py", sha256="2" * 64, packed=gzip.compress(b"evil"), size=4)
    (tmp_path / "run").mkdir()
    with pytest.raises(RegistryError):
        ContentStore(tmp_path / "cas").materialise([file], tmp_path / "run")


