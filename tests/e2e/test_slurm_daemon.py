"""The daemon's Slurm wiring against a real Slurm 22.05 (PEERS.md §7): ``provisioner serve``
with ``[slurm] enabled`` talks to slurmctld through slurmrestd (JWT) and scontrol. A node an
operator drains in Slurm becomes the daemon's maintenance flag with Slurm's reason (actor
``slurm``), and a resume clears it, without the daemon draining anything itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_api import Daemon, as_json, new_token, run_cli, running_daemon
from tests.integration.test_slurm import NODE, Cluster
from tests.integration.test_slurm import cluster as cluster  # noqa: F401  (fixture)
from tests.integration.test_slurm import slurmd as slurmd  # noqa: F401  (fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.timeout(180)]


@pytest.fixture
def daemon(cluster: Cluster, tmp_path: Path) -> Iterator[Daemon]:
    settings = ("[lifecycle]\nauto_inspect = false\nauto_deploy = false\n\n"
                "[slurm]\nenabled = true\n"
                f'restd_url = "{cluster.url}"\nuser = "root"\n'
                f'jwt_token = "{cluster.token}"\n'
                f'slurm_conf = "{cluster.slurm.conf}"\n'
                "sync_interval_s = 1\n")
    with running_daemon(tmp_path, settings) as running:
        yield running


def wait_for(what: str, probe: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (seen := probe()) is not None:
            return seen
        time.sleep(0.5)
    raise AssertionError(f"not {what} after {timeout_s} s")


def test_a_drain_in_slurm_becomes_the_daemons_maintenance_flag(
        cluster: Cluster, slurmd: None, daemon: Daemon) -> None:
    token = new_token(daemon, "admin", "slurm-e2e")

    def cli(*args: str) -> Any:
        result = run_cli(daemon, *args, token=token)
        assert result.returncode == 0, result.stderr
        return as_json(result) if "--json" in args else result.stdout

    cli("node", "enroll", "--hostname", NODE, "--serial", "SLURM1", "--mac",
        "52:54:00:aa:10:01")
    cluster.slurm.scontrol("update", f"nodename={NODE}", "state=drain",
                           "reason=ib link flapping")
    shown = wait_for("in maintenance", lambda: (
        node if (node := cli("node", "show", NODE, "--json"))["maintenance"] else None))
    assert shown["maintenance_reason"] == "drained in Slurm by root: ib link flapping"
    history = cli("node", "history", NODE, "--json")
    assert [h["reason"] for h in history if h["actor"] == "slurm"] == [
        "drained in Slurm by root: ib link flapping"]
    assert "DRAIN" in cluster.slurm.scontrol("show", "node", NODE)

    cluster.slurm.scontrol("update", f"nodename={NODE}", "state=resume")
    wait_for("out of maintenance", lambda: (
        True if not cli("node", "show", NODE, "--json")["maintenance"] else None))
    state = cluster.slurm.scontrol("show", "node", NODE)
    assert "DRAIN" not in state, state  # the daemon did not drain it back
