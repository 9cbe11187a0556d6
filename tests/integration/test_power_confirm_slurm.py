"""Power-off of a node that runs Slurm jobs needs a confirmation (issue 30, item 2): a real
slurmctld and slurmd, a real ``sbatch`` job on the node, the API's power request refused
(409 naming the Slurm state) until ``{"confirm": true}``."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.simulation.world import SimWorld
from provisioner.slurm.scontrol import ScontrolSlurm
from provisioner.store.store import Store
from tests.integration.test_api import NODES, running_api
from tests.peers.slurm import (
    Slurm,
    dynamic_cluster,
    running_slurmd,
    slurm_unavailable_reason,
)

pytestmark = [pytest.mark.root, pytest.mark.timeout(150)]
NODE = "gpu-jobs-01"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Slurm, Path]]:
    if (reason := slurm_unavailable_reason()) is not None:
        pytest.skip(reason)
    with dynamic_cluster("slurm-power-") as found:  # dynamic nodes
        yield found


async def _until_state(client: ScontrolSlurm, states: set[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await client.node(NODE)
        if seen is not None and seen.state in states:
            return seen.state
        assert time.monotonic() < deadline, f"{NODE} never reached {states}: {seen}"
        await asyncio.sleep(0.5)


async def test_power_off_of_a_node_running_jobs_needs_confirm(
        aiohttp_client: Any, cluster: tuple[Slurm, Path], store: Store,
        world: SimWorld) -> None:
    slurm, workdir = cluster
    client = ScontrolSlurm(slurm_conf=slurm.conf, timeout_s=20.0)
    async with running_api(aiohttp_client, store, world, slurm=client) as api:
        await api.enroll(serial="JOBS-1", hostname=NODE,
                         bmc={"driver": "fake", "address": "SIM-JOBS"})
        with running_slurmd(slurm, workdir, NODE):
            await _until_state(client, {"IDLE"})
            idle = await api.post(f"{NODES}/{NODE}/power", {"action": "on"})
            assert idle.status == 200, idle.text  # powering on is never refused
            submitted = await asyncio.to_thread(
                subprocess.run, ["sbatch", "-w", NODE, "-o", "/dev/null", "--wrap", "sleep 300"],
                env=slurm.env(), capture_output=True, text=True, timeout=30, check=True)
            job = submitted.stdout.split()[-1]
            try:
                state = await _until_state(client, {"ALLOCATED", "MIXED"})
                for action in ("off", "soft-off", "cycle"):
                    refused = await api.post(f"{NODES}/{NODE}/power", {"action": action})
                    assert refused.status == 409, refused.text
                    detail = refused.body["detail"]
                    assert f"runs Slurm jobs (state {state}" in detail
                    assert f"power {action} kills them" in detail and "confirm" in detail
                history = (await api.get(f"{NODES}/{NODE}/history")).body["items"]
                assert [h["event"] for h in history] == ["enroll", "power_on"]
                confirmed = await api.post(f"{NODES}/{NODE}/power",
                                           {"action": "off", "confirm": True})
                assert confirmed.status == 200, confirmed.text
                assert confirmed.body["power_state"] == "off"
            finally:
                await asyncio.to_thread(subprocess.run, ["scancel", job], env=slurm.env(),
                                        check=False, timeout=30)
    await client.aclose()
