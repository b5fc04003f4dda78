"""pgserver's PostgreSQL, as the tests and the bench start it, takes connections."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolexec import local_postgres

pytestmark = pytest.mark.integration


def test_a_real_server_is_ready_for_connections_when_it_is_returned(tmp_path: Path) -> None:
    pytest.importorskip("pgserver")
    import psycopg

    server = local_postgres.start_pgserver(tmp_path / "pg")
    try:
        with psycopg.connect(server.get_uri()) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        server.cleanup()
