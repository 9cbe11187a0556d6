"""``node why`` asks a real slurmctld (Slurm 22.05, a dynamic ``slurmd -Z``) what it says of an
active node: idle is schedulable; drained, with its reason, blocks the ``slurm`` step; a name
slurmctld does not know blocks it too."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from provisioner.api.why import read_slurm
from provisioner.lifecycle.schedulable import why
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.why import Seen
from tests.integration.kube_support import domain_node
from tests.integration.test_slurm import NODE, Cluster, scontrol
from tests.integration.test_slurm import cluster as cluster  # noqa: F401  (fixtures)
from tests.integration.test_slurm import slurmd as slurmd  # noqa: F401

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]
PASSED = {"passed": True, "at": "2026-01-01T00:00:00+00:00", "failures": []}


@pytest.mark.usefixtures("slurmd")
async def test_the_slurm_step_says_what_slurmctld_says(cluster: Cluster) -> None:  # noqa: F811
    client = scontrol(cluster)
    node = dataclasses.replace(domain_node(NODE), state=NodeState.ACTIVE, power_state="on",
                               facts={"validation": PASSED})
    seen = await read_slurm(client, NODE)
    for _ in range(150):  # slurmd -Z registers within a few seconds
        if seen.state is not None and seen.not_registered is None:
            break
        await asyncio.sleep(0.2)
        seen = await read_slurm(client, NODE)
    assert seen.state is not None and seen.not_registered is None and not seen.draining
    answer = why(node, [], [], Seen(slurm=seen))
    assert answer.steps[-1].status == "ok"
    assert answer.steps[-1].evidence.startswith(f"slurmctld: {seen.state}")

    await client.drain(NODE, "xid 79 on GPU 3")
    try:
        drained = await read_slurm(client, NODE)
        assert drained.draining and drained.reason == "xid 79 on GPU 3"
        answer = why(node, [], [], Seen(slurm=drained))
        assert answer.first_blocking == "slurm" and not answer.schedulable
        assert "DRAIN" in answer.steps[-1].evidence
        assert answer.steps[-1].evidence.endswith("(xid 79 on GPU 3)")
    finally:
        await client.resume(NODE)

    unknown = await read_slurm(client, "gpu-never-seen")
    assert unknown.state is None and not unknown.error
    assert why(dataclasses.replace(node, hostname="gpu-never-seen"), [], [],
               Seen(slurm=unknown)).first_blocking == "slurm"
