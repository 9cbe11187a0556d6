"""A driver the configuration leaves out fails the step with what to configure, and
removing or un-draining a node it never touched succeeds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from provisioner.domain import Node, NodeId
from provisioner.errors import FatalError
from provisioner.lifecycle.routing import Unavailable
from provisioner.lifecycle.states import NodeState

NOW = datetime(2026, 11, 21, tzinfo=UTC)
NODE = Node(id=NodeId("n1"), state=NodeState.JOINING, hostname="gpu-01", serial="S1",
            macs=(), maintenance=False, maintenance_reason="", profile="gpu", rack=None,
            position=None, facts={}, last_error="", checkpoint=(), version=1, history_seq=1,
            bmc=None, created_at=NOW, updated_at=NOW)


async def test_the_step_fails_naming_the_setting() -> None:
    missing = Unavailable("Kubernetes join", "set kube.kubeconfig")
    with pytest.raises(FatalError, match="^Kubernetes join is not configured: set "
                                         "kube.kubeconfig$"):
        await missing.join(NODE)
    assert await missing.remove(NODE) is None  # nothing was ever added there
