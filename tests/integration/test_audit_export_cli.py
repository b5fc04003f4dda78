"""`toolexec audit export --signed`, `audit public-key` and `audit verify-export`, run as
users run them, against a trail folded by the test into a SQLite database."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts import topics
from projections.audit import AuditModel
from projections.audit_export import export_audit, verify_export
from projections.database import make_engine, migrate
from projections.store import Record
from tests.cli_process import toolexec
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_events import invocation

pytestmark = [pytest.mark.integration]


async def _fold(url: str) -> int:
    engine = make_engine(url)
    try:
        await migrate(engine)
        records = [Record(topics.INVOCATIONS, n % 2, n // 2, envelope, "valid")
                   for n, envelope in enumerate(
                       e for i in range(5) for e in invocation(f"inv-{i}", start=i))]
        async with engine.begin() as conn:
            await (await AuditModel().prepare(conn, records)).write(conn)
        return len(records)
    finally:
        await engine.dispose()


async def test_export_round_trips_on_every_store(database_url: str) -> None:
    count = await _fold(database_url)
    key = Ed25519PrivateKey.generate()
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            blob = b"".join([block async for block in export_audit(
                conn, "2026-11-25T12:00:00.000000Z", signing_key=key)])
    finally:
        await engine.dispose()
    result = verify_export(blob.splitlines(keepends=True), [key.public_key()])
    assert result.ok, result.problem
    assert result.records == count


@pytest.fixture
def trail(tmp_path: Path) -> tuple[dict[str, str], int]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'trail.db'}"
    count = asyncio.run(_fold(url))
    return {"TOOLEXEC_DATABASE_URL": url, "TOOLEXEC_STATE_DIR": str(tmp_path / "state")}, count


def test_a_signed_export_verifies_offline_and_an_edit_does_not(
        tmp_path: Path, trail: tuple[dict[str, str], int]) -> None:
    env, count = trail
    key = toolexec("audit", "public-key", cwd=tmp_path, env=env)
    assert key.returncode == 0, key.stderr
    pem = tmp_path / "pipeline.pem"
    pem.write_text(key.stdout)

    export = toolexec("audit", "export", "--signed", "--output", "trail.jsonl", "--json",
                      cwd=tmp_path, env=env)
    assert export.returncode == 0, export.stderr
    summary = json.loads(export.stdout)
    assert summary["records"] == count and summary["signed"]
    stdout = toolexec("audit", "export", cwd=tmp_path, env=env)  # unsigned, to stdout
    assert stdout.returncode == 0 and len(stdout.stdout.splitlines()) == count + 2

    # The verifier needs the file and the key only: no database, no state directory.
    offline = tmp_path / "third-party"
    offline.mkdir()
    (offline / "trail.jsonl").write_bytes((tmp_path / "trail.jsonl").read_bytes())
    verified = toolexec("audit", "verify-export", "trail.jsonl", "--public-key", str(pem),
                        "--json", cwd=offline)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    result = json.loads(verified.stdout)
    assert result["ok"] and result["records"] == count and result["signature_checked"]
    assert not (offline / ".toolexec").exists()

    lines = (offline / "trail.jsonl").read_text().splitlines(keepends=True)
    assert '"inv-0"' in lines[3]
    lines[3] = lines[3].replace('"inv-0"', '"inv-9"')
    (offline / "edited.jsonl").write_text("".join(lines))
    edited = toolexec("audit", "verify-export", "edited.jsonl", "--public-key", str(pem),
                      cwd=offline)
    assert edited.returncode == 1
    assert "line 4" in edited.stderr and "hash does not match" in edited.stderr

    other = tmp_path / "other.pem"
    other.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    wrong = toolexec("audit", "verify-export", "trail.jsonl", "--public-key", str(other),
                     "--json", cwd=offline)
    assert wrong.returncode == 1 and "not by the given" in json.loads(wrong.stdout)[
        "problem"]["reason"]


def test_export_signed_without_a_key_in_production_is_E3805(
        tmp_path: Path, trail: tuple[dict[str, str], int]) -> None:
    env, _ = trail
    env = {**env, "TOOLEXEC_KAFKA_BOOTSTRAP": "127.0.0.1:1"}  # production: no embedded key
    result = toolexec("audit", "export", "--signed", "--output", "trail.jsonl", "--json",
                      cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["code"] == "E3805"
    assert not (tmp_path / "trail.jsonl").exists()
