"""SIGKILL the daemon at random moments while simulated nodes onboard; every node must end
``active``, with a gapless history of exactly one pass, and no side effect done twice.

Two sizes, both in every CI run: ``fast`` (50 nodes, 10 kills) and ``full`` (100 nodes, 20
kills: DESIGN §9's promise)."""

from __future__ import annotations

import os
import random
import sqlite3
import time
from pathlib import Path

import pytest

from provisioner.simulation.world import read_ledger
from tests.e2e.daemon_proc import DaemonProcess, free_port, write_config

pytestmark = pytest.mark.e2e

SIZES = [pytest.param(50, 10, id="fast"), pytest.param(100, 20, id="full")]
PATH = ["enrolled", "inspecting", "inspected", "deploying", "configuring", "joining",
        "validating", "registering", "active"]
# inspect: on, off; deploy: on (netboot), then off and on into the written disk
EFFECTS = {"bootdev": 2, "power_on": 3, "power_off": 2, "image_write": 1, "configure": 1,
           "kube_join": 1, "slurm_register": 1}


def states(db: Path) -> dict[str, str]:
    if not db.exists():
        return {}
    with sqlite3.connect(db) as conn:
        try:
            return dict(conn.execute("SELECT id, state FROM node").fetchall())
        except sqlite3.OperationalError:  # killed before the first migration
            return {}


@pytest.mark.parametrize(("nodes", "kills"), SIZES)
def test_sigkill_at_random_points_resumes_every_node(tmp_path: Path, nodes: int,
                                                     kills: int) -> None:
    seed = int(os.environ.get("PROVISIONER_CRASH_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    state_dir = tmp_path / "state"
    port = free_port()
    config = write_config(
        tmp_path / "provisioner.toml", state_dir, port,
        f"[simulation]\nnodes = {nodes}\nracks = {nodes // 25}\nstep_delay_s = 0.15\n"
        "[daemon]\nshutdown_timeout_s = 5\n")
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    db = state_dir / "provisioner.sqlite"
    progress = []
    for kill in range(kills):
        daemon.start()
        if kill % 2:  # every other kill lands while steps run, however slow the start-up
            daemon.wait_ready(port, timeout_s=60)
        time.sleep(rng.uniform(0.3, 3.0))
        daemon.kill()
        progress.append(sum(1 for s in states(db).values() if s == "active"))
    daemon.start()
    daemon.wait_ready(port)
    deadline = time.monotonic() + 120 * nodes / 50
    while time.monotonic() < deadline:
        final = states(db)
        if len(final) == nodes and all(s == "active" for s in final.values()):
            break
        time.sleep(0.2)
    assert daemon.stop() == 0
    log = (tmp_path / "daemon.log").read_text()
    context = f"seed={seed} active after each kill={progress}"

    final = states(db)
    assert len(final) == nodes, context
    assert set(final.values()) == {"active"}, context
    assert "resuming" in log, f"no kill landed while a step ran; {context}"

    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT node_id, seq, from_state, to_state FROM transition ORDER BY node_id, seq"
        ).fetchall()
    by_node: dict[str, list[tuple[int, str, str]]] = {}
    for node_id, seq, before, after in rows:
        by_node.setdefault(node_id, []).append((seq, before, after))
    for node_id, history in by_node.items():
        assert [seq for seq, _, _ in history] == list(range(1, len(history) + 1)), node_id
        assert [after for _, _, after in history] == PATH, (node_id, history, context)
        for (_, _, previous), (_, before, _) in zip(history, history[1:], strict=False):
            assert before == previous, (node_id, history)

    ledger = read_ledger(state_dir / "simworld.sqlite")
    machines = {key for key, _ in ledger}
    assert len(machines) == nodes
    for machine in machines:
        done = {op: effects for (key, op), (_calls, effects) in ledger.items() if key == machine}
        assert done == EFFECTS, (machine, done, context)
