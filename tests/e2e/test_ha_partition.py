"""A daemon cut off from PostgreSQL (a TCP proxy the test controls) for longer than its
lease: it stands down two thirds of a lease after its last confirmed renewal (its steps
stopped, their fencing numbers forgotten), the other daemon takes its nodes over, and when
the cut daemon comes back no step of its wakes to act on them; every node still ends
``active`` with one gapless pass and every side effect once. Then PostgreSQL itself restarts
mid-onboarding, while the second daemon is still starting: the daemons reconnect, the second
one finishes starting, and every node still ends ``active``."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from provisioner.simulation.world import read_ledger
from tests.e2e.daemon_proc import DaemonProcess
from tests.e2e.ha_support import EFFECTS, check_one_pass, histories, node_states
from tests.peers.ports import free_tcp_port
from tests.peers.postgres import postgres_unavailable_reason, running_postgres
from tests.peers.tcp_proxy import tcp_proxy

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

NODES = 30
LEASE_S = 3.0
CUT_S = 10.0


def _daemon(tmp: Path, name: str, state_dir: Path, url: str, port: int) -> DaemonProcess:
    config = tmp / f"{name}.toml"
    config.write_text(
        f'state_dir = "{state_dir}"\ndatabase_url = "{url}"\n'
        f'[api]\nlisten = "127.0.0.1:{port}"\n'
        f"[simulation]\nnodes = {NODES}\nstep_delay_s = 0.3\n"
        f'[daemon]\nshutdown_timeout_s = 5\n[ha]\nlease_s = {LEASE_S}\ninstance = "{name}"\n')
    return DaemonProcess(config, tmp / f"{name}.log")


def _leases(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT owner, count(*) FROM node_lease WHERE owner IS NOT NULL "
                            "AND expires_at > now() GROUP BY owner").fetchall()
    return {owner: int(n) for owner, n in rows}


def _wait(what: str, check, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _all_active(dsn: str) -> bool:
    final = node_states(dsn)
    return len(final) == NODES and set(final.values()) == {"active"}


def test_cut_daemon_is_fenced_and_its_nodes_taken_over(tmp_path: Path) -> None:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as pg, tcp_proxy(pg.port) as proxy:
        url = pg.create_database("ha_partition")
        dsn = pg.dsn("ha_partition")
        cut_url = url.replace(f":{pg.port}/", f":{proxy.port}/")
        state_dir = tmp_path / "state"
        ports = [free_tcp_port(), free_tcp_port()]
        a = _daemon(tmp_path, "daemon-a", state_dir, cut_url, ports[0])
        b = _daemon(tmp_path, "daemon-b", state_dir, url, ports[1])
        try:
            a.start()
            a.wait_ready(ports[0], timeout_s=120)
            b.start()
            b.wait_ready(ports[1], timeout_s=120)
            _wait("daemon-a to drive nodes", lambda: _leases(dsn).get("daemon-a", 0) >= 3, 60)
            proxy.cut()
            cut_at = time.monotonic()
            _wait("daemon-b to take daemon-a's nodes",
                  lambda: "daemon-a" not in _leases(dsn), CUT_S)
            taken_after = time.monotonic() - cut_at
            time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
            proxy.restore()
            _wait("every node active", lambda: _all_active(dsn), 240)
            _wait("daemon-a to have stood down",
                  lambda: "stopped driving" in a.log_path.read_text(), 30)
        finally:
            codes = [a.stop(), b.stop()]
        assert codes == [0, 0], a.tail() + b.tail()
        log_a, log_b = a.log_path.read_text(), b.log_path.read_text()
        assert "took over" in log_b
        assert "before another daemon may take them over" in log_a
        for node_id, history in histories(dsn).items():
            check_one_pass(node_id, history)
        ledger = read_ledger(state_dir / "simworld.sqlite")
        for machine in {key for key, _ in ledger}:
            done = {op: e for (key, op), (_calls, e) in ledger.items() if key == machine}
            assert done == EFFECTS, (machine, done)
        print(f"\nHA partition: daemon-a's nodes taken over {taken_after:.1f} s after the cut "
              f"(lease {LEASE_S:g} s)")


def test_postgres_restart_mid_onboarding(tmp_path: Path) -> None:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as pg, tcp_proxy(pg.port) as proxy:
        # every daemon reaches PostgreSQL through the proxy: cutting it for 5 s is, to the
        # daemons, a PostgreSQL restart (every connection dropped, new ones refused)
        url = pg.create_database("ha_restart").replace(f":{pg.port}/", f":{proxy.port}/")
        dsn = pg.dsn("ha_restart")
        state_dir = tmp_path / "state"
        ports = [free_tcp_port(), free_tcp_port()]
        daemons = [_daemon(tmp_path, f"daemon-{i}", state_dir, url, port)
                   for i, port in enumerate(ports)]
        first, second = daemons
        try:
            first.start()
            first.wait_ready(ports[0], timeout_s=120)
            _wait("onboarding under way",
                  lambda: sum(_leases(dsn).values()) >= 5, 60)
            # the second daemon's API answers before it has resumed its nodes, seeded the
            # rack and settled open BMC rotations: the restart lands in that window, or
            # just after it (the daemon must wait for the database, not exit)
            second.start()
            second.wait_ready(ports[1], timeout_s=120, poll_s=0.005)
            proxy.cut()
            time.sleep(5.0)
            proxy.restore()
            _wait("every node active", lambda: _all_active(dsn), 240)
        finally:
            codes = [daemon.stop() for daemon in daemons]
        assert codes == [0, 0], "".join(daemon.tail() for daemon in daemons)
        for node_id, history in histories(dsn).items():
            check_one_pass(node_id, history)
        logs = "".join(d.log_path.read_text() for d in daemons)
        assert "retrying" in logs or "lease renewal failed" in logs
        assert "provisioner.daemon: ready" in second.log_path.read_text()
