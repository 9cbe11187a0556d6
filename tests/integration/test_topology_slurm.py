"""Our topology.conf (topology/tree) against a real slurmctld (Slurm 22.05, PEERS.md §7):
it starts with the file, and ``scontrol show topology`` lists exactly the switches, levels,
nodes and child switches we emitted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.topology.emit import TreePlan, plan_tree, tree_conf
from provisioner.topology.fabric import build_fabric
from provisioner.topology.fleet import build_fleet
from provisioner.topology.hostlist import compress, expand
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover
from tests.peers.slurm import running_munged, running_slurmctld, slurm_unavailable_reason
from tests.topology_support.nvsmi import FIXTURES

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def munge_socket() -> Iterator[Path]:
    if (reason := slurm_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_munged() as sock:
        yield sock


def shown_topology(text: str) -> dict[str, dict[str, str]]:
    switches = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "SwitchName" in fields:
            switches[fields.pop("SwitchName")] = fields
    return switches


def expected(plan: TreePlan) -> dict[str, dict[str, object]]:
    nodes: dict[str, set[str]] = {}
    result: dict[str, dict[str, object]] = {}
    for switch in plan.switches:          # leaves first, so children are known
        below = set(switch.nodes).union(*(nodes[c] for c in switch.children))
        nodes[switch.name] = below
        result[switch.name] = {"Level": str(switch.tier - 1), "Nodes": below,
                               "Switches": set(switch.children)}
    return result


@pytest.mark.parametrize("relative", [
    "infiniband-sim/healthy/ibnetdiscover.txt",
    "infiniband-sim/faults/ibnetdiscover.txt",
    "infiniband/topograph-ibnetdiscover-example.out",
    "infiniband/treydock-ibnetdiscover-ports-test.out",
])
def test_slurmctld_accepts_our_tree(relative: str, munge_socket: Path, tmp_path: Path) -> None:
    fleet = build_fleet(build_fabric(parse_ibnetdiscover((FIXTURES / relative).read_text())))
    plan = plan_tree(fleet)
    hosts = sorted({h for s in plan.switches for h in s.nodes})
    node_line = (f"NodeName={compress(hosts)} NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 "
                 "State=UNKNOWN")
    with running_slurmctld(tmp_path, [node_line], tree_conf(plan, relative), munge_socket) as slurm:
        shown = shown_topology(slurm.scontrol("show", "topology"))
        log = slurm.log.read_text(errors="replace")
    want = expected(plan)
    assert set(shown) == set(want)
    for name, fields in shown.items():
        assert fields["Level"] == want[name]["Level"], name
        assert set(expand(fields["Nodes"])) == want[name]["Nodes"], name
        switches = set(expand(fields["Switches"])) if "Switches" in fields else set()
        assert switches == want[name]["Switches"], name
    assert "topology/tree: _log_switches" in log      # the plugin read our file
    for bad in ("fatal", "Invalid node name", "has no nodes", "invalid child",
                "lack access to"):
        assert bad not in log, f"slurmctld log has {bad!r}"


def test_slurmctld_reports_a_broken_file(munge_socket: Path, tmp_path: Path) -> None:
    """The check above would notice: a switch naming an unknown child is fatal."""
    node = "NodeName=n1 NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN"
    broken = "SwitchName=s0 Switches=nope\nSwitchName=s1 Nodes=n1\n"
    with pytest.raises(RuntimeError, match="peer not ready"), \
            running_slurmctld(tmp_path, [node], broken, munge_socket):
        pass
    assert "invalid child" in (tmp_path / "slurmctld.log").read_text(errors="replace")
