"""Without Slurm, ``registering`` hands the node to Kubernetes workloads: the operand hold is
released (and the GPU stack awaited) through the joiner; without Kubernetes, nothing to do."""

from __future__ import annotations

from datetime import UTC, datetime

from provisioner.domain import Node, NodeId
from provisioner.kube.release import KubeOnlyHandoff
from provisioner.lifecycle.states import NodeState

NOW = datetime(2026, 11, 21, tzinfo=UTC)
NODE = Node(id=NodeId("n1"), state=NodeState.REGISTERING, hostname="gpu-01", serial="S1",
            macs=(), maintenance=False, maintenance_reason="", profile="gpu", rack=None,
            position=None, facts={}, last_error="", checkpoint=(), version=1, history_seq=1,
            bmc=None, created_at=NOW, updated_at=NOW)


class Joiner:
    def __init__(self) -> None:
        self.released: list[str] = []

    async def release_operands(self, node: Node) -> None:
        self.released.append(node.id)


async def test_register_releases_the_operands_once_per_call() -> None:
    joiner = Joiner()
    handoff = KubeOnlyHandoff(joiner)
    await handoff.register(NODE)
    await handoff.remove(NODE)
    assert joiner.released == ["n1"]

