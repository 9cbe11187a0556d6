"""Expiry sweeps run on the one daemon leading the singletons: two ``provisioner serve`` on
one real PostgreSQL; expired tokens and lapsed DHCP leases written into the shared tables
are swept, every time by the leader (its log names it; the other daemon's log has no sweep);
the leader is SIGKILLed, and the other daemon takes the lead and sweeps from then on."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.ha_support import Fleet, get_json, viewer_token
from tests.peers.postgres import PostgresServer, postgres_unavailable_reason, running_postgres

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

LEASE_S = 1.0  # the lead, and the sweep period
ROUNDS = 3  # expired rows written and swept while the first leader lives
SWEPT = re.compile(r"expiry sweep by (\S+): (\d+) DHCP leases expired or freed, "
                   r"(\d+) expired tokens deleted")


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


def _write_expired(dsn: str, tag: str) -> None:
    """Two expired agent-style tokens and one lapsed bound lease, as time leaves them."""
    with psycopg.connect(dsn) as conn:
        for n in range(2):
            conn.execute(
                "INSERT INTO api_token (id, name, role, token_hash, created_at, expires_at) "
                "VALUES (%s, %s, 'agent', %s, now() - interval '2 hours', "
                "now() - interval '1 hour')",
                (secrets.token_hex(6), f"expired:{tag}:{n}", secrets.token_hex(32)))
        octet = int(tag.rsplit("-", 1)[1])
        conn.execute(
            "INSERT INTO lease (mac, ip, state, expires_at, updated_at) VALUES "
            "(%s, %s, 'bound', now() - interval '1 minute', now() - interval '5 minutes')",
            (f"52:54:00:5e:00:{octet:02x}", f"10.99.0.{octet}"))


def _unswept(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        tokens = conn.execute("SELECT count(*) FROM api_token WHERE expires_at < now()"
                              ).fetchone()
        leases = conn.execute("SELECT count(*) FROM lease WHERE state = 'bound' "
                              "AND expires_at < now()").fetchone()
    assert tokens is not None and leases is not None
    return int(tokens[0]) + int(leases[0])


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _sweepers(log: str) -> list[str]:
    return [m.group(1) for m in SWEPT.finditer(log)]


def _holder(port: int, token: str) -> str | None:
    listing = get_json(port, "/api/v1/instances", token)
    assert isinstance(listing, dict)
    holder = listing["singleton_holder"]
    return holder if isinstance(holder, str) else None


def test_only_the_leader_sweeps_and_the_lead_moves(pg: PostgresServer, tmp_path: Path) -> None:
    url = pg.create_database("ha_sweeps")
    dsn = pg.dsn("ha_sweeps")
    fleet = Fleet(tmp_path, url, 2,
                  f"[daemon]\nshutdown_timeout_s = 5\n[ha]\nlease_s = {LEASE_S}\n")
    for i, daemon in enumerate(fleet.daemons):  # fixed instance ids, named in the logs
        daemon.config.write_text(daemon.config.read_text() + f'instance = "sweeper-{i}"\n')
    try:
        for daemon, port in zip(fleet.daemons, fleet.ports, strict=True):
            daemon.start()
            daemon.wait_ready(port, timeout_s=120)
        token = viewer_token(fleet.daemons[0].config)
        _wait("a singleton holder", lambda: _holder(fleet.ports[0], token) is not None, 30)
        leader = _holder(fleet.ports[0], token)
        assert leader in ("sweeper-0", "sweeper-1")
        first, other = (0, 1) if leader == "sweeper-0" else (1, 0)
        for n in range(ROUNDS):
            _write_expired(dsn, f"round-{n + 1}")
            _wait(f"round {n + 1} swept", lambda: _unswept(dsn) == 0, 10 * LEASE_S)
        _wait("the sweep logged", lambda: len(_sweepers(fleet.logs())) >= ROUNDS, 10)
        before_kill = fleet.daemons[first].log_path.read_text()
        assert set(_sweepers(before_kill)) == {leader}
        assert _sweepers(fleet.daemons[other].log_path.read_text()) == []
        fleet.daemons[first].kill()
        killed_at = time.monotonic()
        _write_expired(dsn, "round-9")
        _wait("the other daemon to sweep", lambda: _unswept(dsn) == 0, 10 * LEASE_S)
        took_over_s = time.monotonic() - killed_at
        survivor = f"sweeper-{other}"
        _wait("the survivor to lead", lambda: _holder(fleet.ports[other], token) == survivor,
              10 * LEASE_S)
        assert set(_sweepers(fleet.daemons[other].log_path.read_text())) == {survivor}
        assert fleet.daemons[first].log_path.read_text() == before_kill  # dead: no more sweeps
    finally:
        codes = [daemon.stop() for daemon in fleet.daemons]
    assert codes[other] == 0, fleet.daemons[other].tail()
    print(f"\nexpiry sweeps: leader {leader} swept {ROUNDS} rounds alone; "
          f"{survivor} swept {took_over_s:.1f} s after the leader was killed (lease {LEASE_S:g} s)")
