"""Live discovery on a simulated fabric: ibsim + OpenSM, ibnetdiscover/iblinkinfo through
umad2sim (PEERS.md §8). A 2-tier fat tree is discovered as recorded; unplugging a leaf-spine
cable shows up as degraded health; a slow HCA link as a degraded rate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.topology.emit import plan_tree, tree_conf
from provisioner.topology.fabric import build_fabric
from provisioner.topology.fleet import build_fleet
from provisioner.topology.health import diff_fabric
from provisioner.topology.hostlist import expand
from provisioner.topology.model import Code, Health
from provisioner.topology.parse_iblinkinfo import parse_iblinkinfo
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover
from tests.peers.ibsim import SimFabric, ibsim_unavailable_reason, running_fabric
from tests.topology_support.nvsmi import FIXTURES

pytestmark = pytest.mark.root
NET = FIXTURES / "infiniband-sim/fattree-hdr.net"
HOSTS = set(expand("gpu-node-[01-16]"))


@pytest.fixture
def fabric_sim(tmp_path: Path) -> Iterator[SimFabric]:
    if (reason := ibsim_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_fabric(NET, tmp_path) as sim:
        yield sim


def discover(sim: SimFabric) -> str:
    result = sim.run("ibnetdiscover")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_two_tier_fat_tree(fabric_sim: SimFabric) -> None:
    fabric = build_fabric(parse_ibnetdiscover(discover(fabric_sim)), HOSTS)
    assert fabric.health is Health.OK and not fabric.findings
    assert sorted((s.tier, s.name) for s in fabric.switches) == [
        (1, "ib-leaf-01"), (1, "ib-leaf-02"), (1, "ib-leaf-03"), (1, "ib-leaf-04"),
        (2, "ib-spine-01"), (2, "ib-spine-02")]
    assert set(fabric.hosts()) == HOSTS
    assert str(fabric.expected_host_rate) == "4xHDR"
    recorded = build_fabric(parse_ibnetdiscover(
        (FIXTURES / "infiniband-sim/healthy/ibnetdiscover.txt").read_text()), HOSTS)
    assert tree_conf(plan_tree(build_fleet(fabric))) == tree_conf(plan_tree(build_fleet(recorded)))
    links = parse_iblinkinfo(fabric_sim.run("iblinkinfo").stdout)
    assert build_fabric(links, HOSTS).health is Health.OK and len(links.links) == 24


def test_unplugged_leaf_spine_link_is_degraded(fabric_sim: SimFabric) -> None:
    baseline = build_fabric(parse_ibnetdiscover(discover(fabric_sim)), HOSTS)
    fabric_sim.console('Unlink "ib-spine-02"[3]')     # spine-02 port 3 <-> leaf-03 port 6
    text = fabric_sim.wait_for(lambda out: '"S-0000000000200005"[3]' not in out)
    fabric = build_fabric(parse_ibnetdiscover(text), HOSTS)
    assert fabric.health is Health.DEGRADED
    assert [(f.code, f.subject) for f in fabric.findings] == [
        (Code.UPLINKS_MISSING, "ib-leaf-03"), (Code.UPLINKS_MISSING, "ib-spine-02")]
    assert [f.subject for f in diff_fabric(baseline, fabric)] == [
        "ib-leaf-03[6] - ib-spine-02[3]"]
    fleet = build_fleet(fabric)
    assert {n.hostname for n in fleet.nodes if n.health is Health.DEGRADED} == set(
        expand("gpu-node-[09-12]"))
    assert "SwitchName=ib-spine-02 Switches=ib-leaf-[01-02,04]" in tree_conf(plan_tree(fleet))
    links = parse_iblinkinfo(fabric_sim.run("iblinkinfo").stdout)
    leaf3 = next(n.guid for n in links.nodes if n.description == "ib-leaf-03")
    assert any(p.ref.guid == leaf3 and p.ref.port == 6 for p in links.idle_ports)
    assert build_fabric(links, HOSTS).health is Health.DEGRADED


def test_unplugged_host_is_missing(fabric_sim: SimFabric) -> None:
    fabric_sim.console('Unlink "ib-leaf-04"[4]')
    text = fabric_sim.wait_for(lambda out: "gpu-node-16" not in out)
    fabric = build_fabric(parse_ibnetdiscover(text), HOSTS)
    assert [(f.code, f.subject) for f in fabric.findings] == [(Code.HOST_MISSING, "gpu-node-16")]


def test_slow_hca_link_is_a_degraded_rate(tmp_path: Path) -> None:
    if (reason := ibsim_unavailable_reason()) is not None:
        pytest.skip(reason)
    net = NET.read_text()
    for end in ('[1]\t"ib-leaf-02"[3]', '[3]\t"gpu-node-07 mlx5_0"[1]'):   # both ends of the cable
        net = net.replace(f"{end}\t\t# lid 0 4xHDR", f"{end}\t\t# lid 0 4xSDR")
    (tmp_path / "slow.net").write_text(net)
    with running_fabric(tmp_path / "slow.net", tmp_path) as sim:
        fabric = build_fabric(parse_ibnetdiscover(discover(sim)), HOSTS)
        linkinfo = build_fabric(parse_iblinkinfo(sim.run("iblinkinfo").stdout), HOSTS)
    for built in (fabric, linkinfo):
        assert [(f.code, f.subject) for f in built.findings] == [
            (Code.RATE_DEGRADED, "gpu-node-07 mlx5_0[1] - ib-leaf-02[3]")]
        node = build_fleet(built).node("gpu-node-07")
        assert node is not None and node.health is Health.DEGRADED
