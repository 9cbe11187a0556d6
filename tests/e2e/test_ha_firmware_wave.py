"""A firmware wave driven once by three daemons on one real PostgreSQL (issue 25): simulated
nodes onboard through an inventory runbook (their FirmwareInventory read into their facts),
the fleet's drift shows them all drifted, an operator starts a wave through one daemon, the
``fleet`` singleton's leader is SIGKILLed mid-wave and restarted; the wave ends ``done``
with every node serviced exactly once, each machine's BIOS installed once, at most the
rack's share in ``servicing`` at any moment (from the history in commit order), and the
drift then all conforming."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from provisioner.simulation.world import read_ledger
from tests.e2e.ha_support import Fleet, get_json, node_states
from tests.peers.postgres import PostgresServer, postgres_unavailable_reason, running_postgres

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

NODES = 36  # two racks of 18
LEASE_S = 2.0
CONFIG = f"""[simulation]
nodes = {NODES}
racks = 2
step_delay_s = 0.05
[daemon]
shutdown_timeout_s = 5
[ha]
lease_s = {LEASE_S}
[servicing]
image_base_url = "http://127.0.0.1:1/firmware"
task_poll_s = 0.05
[servicing.runbooks.inventory]
steps = ["firmware_inventory"]
[servicing.runbooks.fw]
steps = ["firmware_update"]
[servicing.profiles.gpu-worker]
onboarding_runbook = "inventory"
wave_runbook = "fw"
[[servicing.profiles.gpu-worker.firmware]]
id = "BIOS"
version = "1.2.0"
image = "bios-1.2.0.bin"
"""


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _token(config: Path, role: str) -> str:
    done = subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                           "token", "create", "--role", role, "--name", f"wave-{role}"],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.splitlines()[-1]


def _post(port: int, path: str, body: object, token: str) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        found = json.load(response)
    assert isinstance(found, dict)
    return found


def _json(port: int, path: str, token: str) -> dict[str, object]:
    found = get_json(port, path, token)
    assert isinstance(found, dict)
    return found


def test_a_wave_is_driven_once_by_three_daemons(pg: PostgresServer, tmp_path: Path) -> None:
    url = pg.create_database("ha_wave")
    dsn = pg.dsn("ha_wave")
    fleet = Fleet(tmp_path, url, 3, CONFIG)
    try:
        for daemon in fleet.daemons:
            daemon.start()
        for daemon, port in zip(fleet.daemons, fleet.ports, strict=True):
            daemon.wait_ready(port, timeout_s=120)
        _wait("every simulated node active", lambda: (
            len(states := node_states(dsn)) == NODES and set(states.values()) == {"active"}),
              240)
        viewer = _token(fleet.daemons[0].config, "viewer")
        operator = _token(fleet.daemons[0].config, "operator")
        drift = _json(fleet.ports[1], "/api/v1/firmware/drift", viewer)
        assert drift["counts"] == {"conforming": 0, "drifted": NODES, "updating": 0,
                                   "failed": 0, "unknown": 0}, drift["counts"]
        wave = _post(fleet.ports[2], "/api/v1/firmware/waves", {
            "profile": "gpu-worker", "max_nodes": 6, "max_rack_share": 0.25,
            "stop_after_failures": 1}, operator)
        path = f"/api/v1/firmware/waves/{wave['id']}"

        def passed() -> int:
            counts = _json(fleet.ports[0], path, viewer)["counts"]
            assert isinstance(counts, dict)
            return int(counts.get("passed", 0))

        _wait("a few nodes passed", lambda: passed() >= 6, 120)
        holder = _json(fleet.ports[0], "/api/v1/instances", viewer)["singleton_holder"]
        items = _json(fleet.ports[0], "/api/v1/instances", viewer)["items"]
        assert isinstance(items, list)
        ports = {i["id"]: int(str(i["api_listen"]).rsplit(":", 1)[1]) for i in items}
        leader = fleet.ports.index(ports[str(holder)])
        fleet.daemons[leader].kill()  # mid-wave: the lead moves, the wave goes on
        survivor = fleet.ports[(leader + 1) % 3]
        fleet.daemons[leader].start()
        fleet.daemons[leader].wait_ready(fleet.ports[leader], timeout_s=120)
        _wait("the wave done", lambda: _json(survivor, path, viewer)["status"] != "running",
              300)
        ended = _json(survivor, path, viewer)
        _wait("no node in servicing", lambda: "servicing" not in node_states(dsn).values(), 60)
        after = _json(survivor, "/api/v1/firmware/drift", viewer)
    finally:
        codes = [daemon.stop() for daemon in fleet.daemons]
    assert codes == [0, 0, 0], "".join(d.tail() for d in fleet.daemons)
    assert ended["status"] == "done" and ended["counts"] == {"passed": NODES}, ended
    assert after["counts"]["conforming"] == NODES, after["counts"]  # type: ignore[index]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT t.id, t.node_id, t.from_state, t.to_state, t.actor, n.rack "
                            "FROM transition t JOIN node n ON n.id = t.node_id "
                            "ORDER BY t.id").fetchall()
    waved = Counter(node for _, node, before, to, actor, _ in rows
                    if before == "active" and to == "servicing")
    assert len(waved) == NODES and set(waved.values()) == {1}  # each node once
    assert {actor for _, _, before, to, actor, _ in rows
            if before == "active" and to == "servicing"} == {f"wave:{wave['id']}"}
    inside: set[str] = set()  # nodes the wave is servicing, in commit order
    now: defaultdict[str, int] = defaultdict(int)
    peak: defaultdict[str, int] = defaultdict(int)
    for _, node, before, to, _, rack in rows:
        if before == "active" and to == "servicing":
            inside.add(node)
            now[rack] += 1
        elif before == "servicing" and node in inside:
            inside.discard(node)
            now[rack] -= 1
        peak[rack] = max(peak[rack], now[rack])
    assert max(peak.values()) <= 4, dict(peak)  # 18 × 0.25, at every moment
    ledger = read_ledger(fleet.state_dir / "simworld.sqlite")
    installs = {key: effects for (key, op), (_calls, effects) in ledger.items()
                if op == "fw_install:BIOS"}
    assert len(installs) == NODES and set(installs.values()) == {1}
    updates = {key: calls for (key, op), (calls, _effects) in ledger.items()
               if op == "fw_update:BIOS"}
    print(f"\nfirmware wave over {NODES} nodes on 3 daemons, leader killed mid-wave; "
          f"SimpleUpdate calls per machine: {sorted(Counter(updates.values()).items())}")
    assert set(updates.values()) == {1}, Counter(updates.values())  # never asked twice
