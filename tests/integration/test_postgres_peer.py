from __future__ import annotations

import socket

import psycopg
import pytest
import sqlalchemy

from tests.peers.postgres import postgres_unavailable_reason, running_postgres

pytestmark = pytest.mark.postgres


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_postgres_peer_serves_a_new_database_and_stops() -> None:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as pg:
        assert pg.url == f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/postgres"
        url = pg.create_database("peer_check")
        assert url == f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/peer_check"
        with psycopg.connect(pg.dsn("peer_check")) as conn:
            assert conn.execute("SELECT 1, current_database()").fetchone() == (1, "peer_check")
        engine = sqlalchemy.create_engine(url)  # the URL is what the store will be given
        with engine.connect() as conn_sa:
            assert conn_sa.execute(sqlalchemy.text("SELECT 1")).scalar_one() == 1
        engine.dispose()
        port = pg.port
        assert _port_open(port)
    assert not _port_open(port)
