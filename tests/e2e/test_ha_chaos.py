"""Three daemons on one real PostgreSQL onboard simulated nodes while a random one is
SIGKILLed and restarted, again and again (issue 13): every node ends ``active``, each
history is one gapless pass, no side effect runs twice (the simulator's ledger), and no two
daemons ever wrote for one node at once (history instance ids and fencing numbers).

``PROVISIONER_HA_NODES`` / ``PROVISIONER_HA_KILLS`` / ``PROVISIONER_HA_SEED`` raise or
replay the run (the defaults fit this loaded 2-core machine); ``PROVISIONER_HA_IN_TURN=1``
kills the daemons in turn (0, 1, 2, 0, …) instead of at random (issue 29's proof: 300 nodes,
each daemon SIGKILLed in turn)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.simulation.world import read_ledger
from tests.e2e.ha_support import (
    EFFECTS,
    PATH,
    Fleet,
    check_one_pass,
    get_json,
    histories,
    node_states,
    viewer_token,
)
from tests.peers.postgres import PostgresServer, postgres_unavailable_reason, running_postgres

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

NODES = int(os.environ.get("PROVISIONER_HA_NODES", "200"))
KILLS = int(os.environ.get("PROVISIONER_HA_KILLS", "20"))
IN_TURN = os.environ.get("PROVISIONER_HA_IN_TURN") == "1"
LEASE_S = 3.0


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


def test_three_daemons_survive_random_sigkills(pg: PostgresServer, tmp_path: Path) -> None:
    seed = int(os.environ.get("PROVISIONER_HA_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    url = pg.create_database("ha_chaos")
    dsn = pg.dsn("ha_chaos")
    fleet = Fleet(tmp_path, url, 3,
                  f"[simulation]\nnodes = {NODES}\nracks = 3\nstep_delay_s = 0.3\n"
                  f"[daemon]\nshutdown_timeout_s = 5\n[ha]\nlease_s = {LEASE_S}\n")
    started = time.monotonic()
    try:
        for daemon in fleet.daemons:
            daemon.start()
        for daemon, port in zip(fleet.daemons, fleet.ports, strict=True):
            daemon.wait_ready(port, timeout_s=120)
        token = viewer_token(fleet.daemons[0].config)
        listing = get_json(fleet.ports[0], "/api/v1/instances", token)
        assert isinstance(listing, dict) and len(listing["items"]) == 3, listing
        kills: list[tuple[int, int]] = []  # (daemon, nodes active then)
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.5, 2.0))
            victim = len(kills) % 3 if IN_TURN else rng.randrange(3)
            fleet.daemons[victim].kill()
            kills.append((victim, sum(1 for s in node_states(dsn).values() if s == "active")))
            fleet.daemons[victim].start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            final = node_states(dsn)
            if len(final) == NODES and set(final.values()) == {"active"}:
                break
            time.sleep(0.5)
        wall = time.monotonic() - started
        for daemon, port in zip(fleet.daemons, fleet.ports, strict=True):
            daemon.wait_ready(port, timeout_s=120)
        # a leader killed last holds "fleet" until its lease runs out: wait for the next one
        listing = get_json(fleet.ports[0], "/api/v1/instances", token)
        holder_deadline = time.monotonic() + 4 * LEASE_S + 30
        while (isinstance(listing, dict) and listing["singleton_holder"] is None
               and time.monotonic() < holder_deadline):
            time.sleep(0.5)
            listing = get_json(fleet.ports[0], "/api/v1/instances", token)
        some_node = next(iter(node_states(dsn)))
        cli = subprocess.run(
            [sys.executable, "-m", "provisioner", "node", "history", some_node, "--json"],
            capture_output=True, text=True, timeout=60, check=True,
            env=dict(os.environ, PROVISIONER_URL=f"http://127.0.0.1:{fleet.ports[1]}",
                     PROVISIONER_TOKEN=token))
        rows = json.loads(cli.stdout)
    finally:
        codes = [daemon.stop() for daemon in fleet.daemons]
    context = f"seed={seed} kills={kills} wall={wall:.0f}s"
    assert codes == [0, 0, 0], context + "".join(d.tail() for d in fleet.daemons)
    final = node_states(dsn)
    assert len(final) == NODES and set(final.values()) == {"active"}, (context, final)

    for node_id, history in histories(dsn).items():
        check_one_pass(node_id, history)
    assert any(active < NODES for _victim, active in kills), f"no kill mid-way; {context}"
    assert "took over" in fleet.logs() or "resuming" in fleet.logs(), context

    ledger = read_ledger(fleet.state_dir / "simworld.sqlite")
    machines = {key for key, _ in ledger}
    assert len(machines) == NODES
    for machine in machines:
        done = {op: effects for (key, op), (_calls, effects) in ledger.items() if key == machine}
        assert done == EFFECTS, (machine, done, context)
    assert isinstance(listing, dict) and listing["singleton_holder"] is not None, listing
    assert [row["to_state"] for row in rows] == PATH
    assert all(row["instance"] for row in rows), rows  # which daemon wrote each row
    assert all(row["fence"] is not None for row in rows[2:]), rows  # step writes: fenced
    print(f"\nHA chaos: {NODES} nodes, {KILLS} kills, {wall:.0f} s wall; {context}")
