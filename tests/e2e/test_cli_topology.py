"""``provisioner topology show`` against a real daemon: a simulated rack goes active on the
``fake`` drivers, the daemon's live topology places it in a stored fabric scan (a real
ibsim capture, host names mapped to the rack's), and the CLI shows it through the API."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_api import Daemon, new_token, run_cli, running_daemon
from tests.topology_support.nvsmi import FIXTURES

pytestmark = pytest.mark.e2e

SETTINGS = (
    "[simulation]\nnodes = 4\nstep_delay_s = 0.01\n\n"
    "[topology]\ndebounce_s = 0.2\nrecompute_interval_s = 2\n"
)
HOSTS = [f"sim-r01-n{n:03d}" for n in range(1, 5)]


def seed_fabric(state_dir: Path) -> None:
    """The fabric scan a node's facts role would have posted (gpu-node-01..04 are the four
    hosts of ib-leaf-01 in the capture)."""
    from provisioner.config import Settings
    from provisioner.store.store import open_store

    text = (FIXTURES / "infiniband-sim" / "healthy" / "ibnetdiscover.txt").read_text()
    text = re.sub(r"gpu-node-(\d\d)", lambda m: f"sim-r01-n{int(m[1]):03d}"
                  if int(m[1]) <= 4 else m[0], text)
    store = open_store(Settings(state_dir=state_dir), migrate=True)
    try:
        asyncio.run(store.topology.save("default", text, reporter_node_id=None))
    finally:
        store.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("e2e-topology")
    seed_fabric(root / "state")
    with running_daemon(root, SETTINGS) as running:
        yield running


def show(daemon: Daemon, token: str | None, *args: str) -> Any:
    return run_cli(daemon, "topology", "show", *args, token=token)


def placed(daemon: Daemon, token: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        result = show(daemon, token, "--json")
        assert result.returncode == 0, result.stderr
        topology: dict[str, Any] = json.loads(result.stdout)
        if sorted(n["hostname"] for n in topology["nodes"] if n["leaf"]) == HOSTS:
            return topology
        if time.monotonic() > deadline:
            pytest.fail(f"rack not placed: {topology['members']} "
                        f"{daemon.log.read_text()[-2000:]}")
        time.sleep(0.5)


def test_topology_show_through_the_cli(daemon: Daemon) -> None:
    viewer = new_token(daemon, "viewer", "e2e-topology-viewer")
    topology = placed(daemon, viewer)
    assert topology["format"] == "tree" and len(topology["digest"]) == 64
    leaf = next(s for s in topology["switches"] if s["name"] == "ib-leaf-01")
    assert leaf["tier"] == 1 and leaf["hosts"] == HOSTS
    node = next(n for n in topology["nodes"] if n["hostname"] == HOSTS[0])
    assert node["path"] == ["ib-leaf-01", "ib-spine-01"]
    assert node["spec"] == "default:ib-spine-01:ib-leaf-01"
    assert [f["name"] for f in topology["fabrics"]] == ["default"]
    assert any(i["code"] == "unknown-host" for i in topology["issues"])  # gpu-node-05..16

    table = show(daemon, viewer)
    assert table.returncode == 0, table.stderr
    assert "HOSTNAME" in table.stdout and "ib-leaf-01/ib-spine-01" in table.stdout
    assert f"{HOSTS[0]}" in table.stdout and "topology/tree" in table.stdout

    tree = show(daemon, viewer, "--format", "tree")
    assert tree.returncode == 0
    assert "SwitchName=ib-leaf-01 Nodes=sim-r01-n[001-004]\n" in tree.stdout
    labels = json.loads(show(daemon, viewer, "--format", "labels").stdout)
    assert labels[HOSTS[1]] == {"fabric.topograph.run/tier-0": "ib-leaf-01",
                                "fabric.topograph.run/tier-1": "ib-spine-01"}
    slinky = json.loads(show(daemon, viewer, "--format", "slinky").stdout)
    assert set(slinky) == set(HOSTS)

    refused = show(daemon, None)
    assert refused.returncode == 1 and refused.stderr.startswith("provisioner: error: ")
    bad = show(daemon, viewer, "--format", "nope")
    assert bad.returncode == 2
