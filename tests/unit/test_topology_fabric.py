"""Building the fabric and the fleet: names, tiers, leaves, health findings."""

from __future__ import annotations

import pytest

from provisioner.topology.fabric import build_fabric, host_of, switch_name
from provisioner.topology.fleet import build_fleet, primary_leaf
from provisioner.topology.health import diff_fabric, port_error_findings
from provisioner.topology.hostlist import compress, expand
from provisioner.topology.model import (
    Code,
    Fabric,
    GpuReport,
    Health,
    IbNode,
    LinkRate,
    NodeKind,
    NvlinkScope,
    Severity,
)
from provisioner.topology.parse_ibdiag import parse_ibqueryerrors
from provisioner.topology.parse_iblinkinfo import parse_iblinkinfo
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover
from provisioner.topology.parse_ibstat import parse_ibstat
from provisioner.topology.parse_nvsmi_text import parse_nvidia_smi
from tests.topology_support.nvsmi import FIXTURES

SIM, IB = FIXTURES / "infiniband-sim", FIXTURES / "infiniband"
HOSTS = set(expand("gpu-node-[01-16]"))


def fabric_of(relative: str, **kwargs: object) -> Fabric:
    text = (FIXTURES / relative).read_text()
    scan = parse_iblinkinfo(text) if "iblinkinfo" in relative else parse_ibnetdiscover(text)
    return build_fabric(scan, **kwargs)  # type: ignore[arg-type]


def codes(fabric: Fabric) -> dict[Code, list[str]]:
    found: dict[Code, list[str]] = {}
    for finding in fabric.findings:
        found.setdefault(finding.code, []).append(finding.subject)
    return found


@pytest.mark.parametrize(("description", "host"), [
    ("gpu-node-01 mlx5_0", "gpu-node-01"), ("dgx-gb200-n01-c1 HCA-1", "dgx-gb200-n01-c1"),
    ("a.example.org mlx5_11", "a.example.org"), ("n1 ibp12s0", "n1"),
    ("MT4129 ConnectX7   Mellanox Technologies", None), ("MT4129 ConnectX7", None),
    ("localhost mlx5_0", None), ("node01", None), ("node_01 mlx5_0", None), ("", None),
    ("-bad mlx5_0", None), ("gpu-node-01  mlx5_0", None),
])
def test_hostnames_from_node_descriptions(description: str, host: str | None) -> None:
    named = host_of(description)
    assert named.hostname == host
    assert (named.finding is None) == (host is not None)


def test_unknown_hosts_are_reported_not_placed() -> None:
    named = host_of("gpu-node-99 mlx5_0", known_hosts=HOSTS)
    assert named.hostname is None and named.finding and named.finding.code is Code.UNKNOWN_HOST


@pytest.mark.parametrize(("description", "name", "model", "found"), [
    ("MF0;A09-P1-IBLEAF-04-04:MQM9701/U1", "A09-P1-IBLEAF-04-04", "MQM9701", False),
    ("ib-leaf-01", "ib-leaf-01", "", False),
    ("  5FB0406-spine-IB02 ", "5FB0406-spine-IB02", "", False),
    ("Mellanox Technologies", "S-0000000000000abc", "", True),
    ("MF0;bad name:MQM/U1", "S-0000000000000abc", "MQM", True),
    ("", "S-0000000000000abc", "", True),
])
def test_switch_names(description: str, name: str, model: str, found: bool) -> None:
    got = switch_name(IbNode("0000000000000abc", NodeKind.SWITCH, description))
    assert got[:2] == (name, model) and (got[2] is not None) == found


def test_healthy_fat_tree() -> None:
    fabric = fabric_of("infiniband-sim/healthy/ibnetdiscover.txt", known_hosts=HOSTS)
    tiers = {s.name: s.tier for s in fabric.switches}
    assert tiers == {**{f"ib-leaf-0{i}": 1 for i in range(1, 5)}, "ib-spine-01": 2,
                     "ib-spine-02": 2}
    leaf = fabric.switch("ib-leaf-02")
    assert leaf and leaf.hosts == tuple(expand("gpu-node-[05-08]"))
    assert leaf.parents == ("ib-spine-01", "ib-spine-02")
    assert set(fabric.hosts()) == HOSTS
    assert fabric.health is Health.OK and not fabric.findings
    assert str(fabric.expected_host_rate) == str(fabric.expected_switch_rate) == "4xHDR"


@pytest.mark.parametrize("relative", ["infiniband-sim/faults/ibnetdiscover.txt",
                                      "infiniband-sim/faults/iblinkinfo.txt"])
def test_unplugged_links_are_degraded_health(relative: str) -> None:
    fabric = fabric_of(relative, known_hosts=HOSTS)
    found = codes(fabric)
    assert fabric.health is Health.DEGRADED
    assert found[Code.UPLINKS_MISSING] == ["ib-leaf-03", "ib-spine-02"]
    assert found[Code.HOST_MISSING] == ["gpu-node-16"]
    fleet = build_fleet(fabric)
    health = {n.hostname: n.health for n in fleet.nodes}
    assert {h for h, v in health.items() if v is Health.DEGRADED} == set(
        expand("gpu-node-[09-12]"))


def test_diff_against_the_baseline() -> None:
    before = fabric_of("infiniband-sim/healthy/ibnetdiscover.txt")
    after = fabric_of("infiniband-sim/faults/ibnetdiscover.txt")
    found = diff_fabric(before, after)
    assert sorted(f.subject for f in found if f.code is Code.LINK_MISSING) == [
        "gpu-node-16 mlx5_0[1] - ib-leaf-04[4]", "ib-leaf-03[6] - ib-spine-02[3]"]
    assert [f.subject for f in found if f.code is Code.NODE_MISSING] == ["gpu-node-16"]
    assert diff_fabric(before, before) == []


def test_degraded_rate_and_inactive_links() -> None:
    text = (SIM / "healthy/ibnetdiscover.txt").read_text()
    slow = text.replace('"gpu-node-07 mlx5_0" lid 13 4xHDR', '"gpu-node-07 mlx5_0" lid 13 4xSDR')
    fabric = build_fabric(parse_ibnetdiscover(slow))
    assert codes(fabric)[Code.RATE_DEGRADED] == ["gpu-node-07 mlx5_0[1] - ib-leaf-02[3]"]
    assert build_fleet(fabric).node("gpu-node-07").health is Health.DEGRADED   # type: ignore[union-attr]
    init = (SIM / "healthy/iblinkinfo.txt").read_text().replace(
        "Active/  LinkUp)==>       2    1[  ]", "Init/  LinkUp)==>       2    1[  ]", 1)
    fabric = build_fabric(parse_iblinkinfo(init))
    assert Code.PORT_DOWN in codes(fabric)


def test_explicit_expected_rate() -> None:
    fabric = fabric_of("infiniband-sim/healthy/ibnetdiscover.txt",
                       expected_host_rate=LinkRate.of(4, "NDR"))
    assert len(codes(fabric)[Code.RATE_DEGRADED]) == 16


def test_port_errors_become_findings() -> None:
    fabric = fabric_of("infiniband-sim/faults/ibnetdiscover.txt")
    errors = parse_ibqueryerrors((SIM / "faults/ibqueryerrors.txt").read_text())
    found = port_error_findings(fabric, errors)
    assert [(f.subject, f.detail) for f in found] == [
        ("ib-leaf-02[5]", "SymbolErrorCounter=1234, LinkDownedCounter=7")]


def test_hca_without_switch() -> None:
    fabric = fabric_of("infiniband/topograph-ibnetdiscover-example-bad.out")
    assert not fabric.switches and fabric.health is Health.DEGRADED
    (finding,) = fabric.findings
    assert finding.severity is Severity.ERROR and "sees no switch" in finding.detail
    node = build_fleet(fabric).node("dgx-gb200-n01-c1")
    assert node is not None and node.leaf is None and node.health is Health.DOWN


def test_real_superpod_names_rails_and_unnamed_hcas() -> None:
    fabric = fabric_of("infiniband/topograph-ibnetdiscover-example.out")
    leaf = fabric.switch("A09-P1-IBLEAF-01-02")
    assert leaf is not None and leaf.model == "MQM9701" and leaf.tier == 1
    # Topograph's own test expects exactly these (c05, c06, c08, c09 carry the default
    # "MT4129 ConnectX7   Mellanox Technologies" description): NVIDIA/topograph
    # pkg/providers/ib test, expected "a06-p1-dgx-02-c[01-04,07,10-12,14,16,18]".
    assert compress(leaf.hosts) == "a06-p1-dgx-02-c[01-04,07,10-12,14,16,18]"
    found = codes(fabric)
    assert len(found[Code.UNNAMED_HCA]) == 72
    assert all("Aggregation" not in h.description for h in fabric.hcas)
    assert {s.tier for s in fabric.switches} == {1, 2}
    fleet = build_fleet(fabric)
    node = fleet.node("a08-p1-dgx-04-c01")
    assert node is not None and len(node.hcas) == 4 and node.leaf == "A09-P1-IBLEAF-01-04"
    assert len({h.switch for h in node.hcas}) == 4          # one rail per leaf


def test_fleet_joins_gpu_reports_and_local_hcas() -> None:
    fabric = fabric_of("infiniband-sim/healthy/ibnetdiscover.txt")
    directory = FIXTURES / "synthetic/nvidia-smi-nvl"
    reports = [parse_nvidia_smi(p.read_text(), p.stem) for p in sorted(directory.iterdir())]
    ethernet_down = parse_ibstat((IB / "gpud-ibstat.47.0.h100.some.down.0.txt").read_text())
    ib_down = parse_ibstat((IB / "gpud-ibstat.47.0.h100.some.down.0.txt").read_text().replace(
        "State: Active", "State: Down", 1))
    fleet = build_fleet(fabric, reports,
                        local_hcas={"gpu-node-01": ib_down, "gpu-node-02": ethernet_down})
    scopes = {n.hostname: n.nvlink.scope for n in fleet.nodes}
    assert [h for h, s in scopes.items() if s is NvlinkScope.MULTI_NODE] == sorted(
        expand("gpu-node-[01-12]"))
    assert scopes["gpu-node-13"] is NvlinkScope.NOT_READY
    assert scopes["gpu-node-15"] is NvlinkScope.SINGLE_NODE
    assert scopes["gpu-node-16"] is NvlinkScope.NONE
    node = fleet.node("gpu-node-09")
    assert node is not None and node.clique and node.clique.endswith(".2")
    assert node.path == ("ib-leaf-03", "ib-spine-01")
    health = {n.hostname: n.health for n in fleet.nodes}
    assert health["gpu-node-01"] is Health.DEGRADED
    assert health["gpu-node-02"] is Health.OK   # its down ports are Ethernet: they do not count
    assert [f.subject for f in fleet.findings if f.code is Code.NVLINK] == [
        "gpu-node-13", "gpu-node-14"]


def test_primary_leaf_prefers_most_hcas_then_name() -> None:
    fabric = fabric_of("infiniband-sim/healthy/ibnetdiscover.txt")
    hcas = fabric.hcas
    assert primary_leaf([]) is None
    assert primary_leaf([h for h in hcas if h.hostname in ("gpu-node-05", "gpu-node-01")]) \
        == "ib-leaf-01"


def test_reports_without_a_valid_hostname_are_left_out() -> None:
    fleet = build_fleet(None, [GpuReport("a,b", ()), GpuReport("", ()), GpuReport("n1", ())])
    assert [n.hostname for n in fleet.nodes] == ["n1"]
    assert [f.code for f in fleet.findings] == [Code.UNKNOWN_HOST, Code.UNKNOWN_HOST]


def test_a_2048_host_fat_tree_is_quick() -> None:
    import time

    from provisioner.topology import emit
    from tests.topology_support.fabric_gen import fat_tree

    started = time.perf_counter()
    fleet = build_fleet(build_fabric(parse_ibnetdiscover(fat_tree(64, 32, 16))))
    conf = emit.tree_conf(emit.plan_tree(fleet))
    emit.topograph_labels(fleet)
    assert time.perf_counter() - started < 10      # ~0.3 s here; quadratic code would not be
    assert len(fleet.nodes) == 2048 and fleet.fabric and fleet.fabric.health is Health.OK
    assert "SwitchName=leaf-064 Nodes=node[02017-02048]" in conf
    assert "SwitchName=spine-16 Switches=leaf-[001-064]" in conf
