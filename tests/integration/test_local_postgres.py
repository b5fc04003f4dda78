"""pgserver's PostgreSQL, as the tests and the bench start it, takes connections."""

from __future__ import annotations

import pytest

from tests.projection_db import pgserver_data_dir
from toolexec import local_postgres

pytestmark = pytest.mark.integration


def test_a_real_server_is_ready_for_connections_when_it_is_returned() -> None:
    pytest.importorskip("pgserver")
    import psycopg

    with pgserver_data_dir() as data:
        server = local_postgres.start_pgserver(data)
        try:
            with psycopg.connect(server.get_uri()) as conn:
                assert conn.execute("select 1").fetchone() == (1,)
        finally:
            server.cleanup()
