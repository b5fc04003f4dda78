"""Retention of the embedded broker: restarted from the archive once it has taken enough,
it keeps only the newest records of the trimmed topics in memory, at their offsets;
the archive keeps everything and the read models read the rest from there."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli_process import REPO, start_up, stop, toolexec
from tests.integration.test_durable_log import until
from tests.integration.test_durable_log_restore import read_log
from tests.waiting import WAIT
from toolexec.broker_control import read_state, stop_broker
from toolexec.log_archive import ArchivedRecord, LogArchive
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

RETAIN = 5
ENV = {"TOOLEXEC_SANDBOX": "rlimits", "TOOLEXEC_BROKER_RETAIN_RECORDS": str(RETAIN),
       "TOOLEXEC_BROKER_COMPACT_AFTER_RECORDS": "60",
       "TOOLEXEC_BROKER_COMPACT_QUIET_SECONDS": "1"}
INVOCATIONS = 24
TOPICS = ("toolexec.invocations", "toolexec.requests")


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    stop_broker(Settings(state_dir=tmp_path / ".toolexec"))


def invocation_rows(project: Path) -> int:
    with sqlite3.connect(project / ".toolexec" / "toolexec.db") as db:
        return int(db.execute("SELECT count(*) FROM invocations").fetchone()[0])


def test_a_compacted_broker_keeps_the_newest_records_and_read_models_keep_all(
        project: Path) -> None:
    up = start_up(project, "--tools", str(REPO / "examples" / "tools"), env=ENV)
    try:
        url = json.loads((project / ".toolexec" / "runtime.json").read_text())["gateway_url"]
        with httpx.Client(base_url=url, timeout=WAIT) as http:
            ids = []
            for n in range(INVOCATIONS):
                answer = http.post("/v1/tools/invoke", json={
                    "tool_id": "word_stats", "parameters": {"text": f"run {n}"}})
                assert answer.status_code == 200, answer.text
                ids.append(answer.json()["invocation_id"])
            until(lambda: (read_state(project / ".toolexec").incarnation >= 2
                           and read_state(project / ".toolexec").status == "ready"),
                  "the broker restarted from its archive")
            state = read_state(project / ".toolexec")
            assert state is not None
            retained = state.data["retained_from"]
            bootstrap = state.bootstrap
            assert bootstrap is not None
            in_broker = asyncio.run(read_log(bootstrap, dict.fromkeys(TOPICS, 4)))

            rebuilt = toolexec("projections", "rebuild", "--json", cwd=project, env=ENV)
            assert rebuilt.returncode == 0, rebuilt.stderr
            answers = [http.get(f"/v1/invocations/{i}") for i in ids]
            health = http.get("/health")
        verified = toolexec("audit", "verify", "--json", cwd=project, env=ENV)
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=WAIT)
        stop(up)

    archive = LogArchive(project / ".toolexec" / "log", read_only=True)
    archived = {(topic, p): [e for e in archive.partition(topic, p).read()
                             if isinstance(e, ArchivedRecord)]
                for topic in TOPICS for p in range(4)}
    # the broker holds each partition's newest records only, at their offsets
    assert retained and all(key.startswith(TOPICS) for key in retained)
    for key, start in retained.items():
        topic, partition = key.rsplit("/", 1)[0], int(key.rsplit("/", 1)[1])
        held = [r for r in in_broker if (r[0], r[1]) == (topic, partition)]
        assert held and min(r[2] for r in held) >= start
        originals = {r.offset: (r.key, r.value) for r in archived[(topic, partition)]}
        assert all(originals[r[2]] == (r[3], r[4]) for r in held)
    assert len(in_broker) < sum(len(v) for v in archived.values())
    # the archive keeps everything; the read models rebuilt from it and the broker
    assert [a.status_code for a in answers] == [200] * INVOCATIONS
    assert {a.json()["status"] for a in answers} == {"completed"}
    assert invocation_rows(project) == INVOCATIONS
    assert json.loads(rebuilt.stdout)["rebuilt"]
    assert verified.returncode == 0, verified.stdout
    assert health.status_code == 200, health.text
