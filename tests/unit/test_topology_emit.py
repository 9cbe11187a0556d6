"""Emitters: topology.conf (tree, block), topology.yaml, Topograph labels, Slinky annotation.

Slurm 22.05 (the Slurm we can run, PEERS.md §7) has no topology/block, so block output is
checked against the grammar topology.conf(5) gives for it (Slurm >= 23.11), quoted here:

    BlockName  The name of a block. This name is internal to Slurm and arbitrary. Each block
               should have a unique name. This field must be specified.
    Nodes      Child nodes of the named block.
    BlockSizes List of the planning base block size, alongside any higher-level block sizes
               that would be enforced. Each block must have at least the planning base block
               size count of nodes. Successive BlockSizes must be a power of two larger than
               the prior values.

and the parser behind it (SchedMD/slurm src/plugins/topology/block/block_record.c:
``BlockName`` S_P_ARRAY with ``Nodes`` required, "block %s hasn't got nodes"; ``BlockSizes``
each a multiple of the first whose quotient is a power of two, at most 2^15; "Block (%s) has
already been defined"). The tree output is checked here against topology.conf(5)'s
SwitchName grammar and, in tests/integration/test_topology_slurm.py, by a real slurmctld.
"""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.topology.emit import (
    SLINKY_ANNOTATION,
    TOPOGRAPH_DOMAIN,
    block_conf,
    plan_blocks,
    plan_tree,
    slinky_annotations,
    topograph_labels,
    topograph_value,
    topology_yaml,
    tree_conf,
)
from provisioner.topology.fabric import build_fabric
from provisioner.topology.fleet import build_fleet
from provisioner.topology.hostlist import expand
from provisioner.topology.model import Code, Fleet, Gpu, GpuReport
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover
from provisioner.topology.parse_nvsmi_text import parse_nvidia_smi
from tests.topology_support import nvsmi
from tests.topology_support.nvsmi import CLUSTER_A, FIXTURES

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def fleet_of(relative: str = "infiniband-sim/healthy/ibnetdiscover.txt",
             gpus: bool = False) -> Fleet:
    fabric = build_fabric(parse_ibnetdiscover((FIXTURES / relative).read_text()))
    directory = FIXTURES / "synthetic/nvidia-smi-nvl"
    reports = ([parse_nvidia_smi(p.read_text(), p.stem) for p in sorted(directory.iterdir())]
               if gpus else [])
    return build_fleet(fabric, reports)


# -- grammar checkers (from the man page text above) ---------------------------------------


def conf_lines(text: str) -> list[dict[str, str]]:
    lines = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pairs = [token.split("=", 1) for token in line.split()]
        assert all(len(p) == 2 and p[0] and p[1] for p in pairs), raw
        lines.append({key.lower(): value for key, value in pairs} | {"_first": pairs[0][0]})
    return lines


def check_block_conf(text: str) -> list[str]:
    problems: list[str] = []
    names: set[str] = set()
    seen: set[str] = set()
    counts: list[int] = []
    sizes: list[int] = []
    for entry in conf_lines(text):
        first = entry.pop("_first").lower()
        if first == "blocksizes":
            assert set(entry) == {"blocksizes"} and not sizes, "one BlockSizes line, alone"
            sizes = [int(v) for v in entry["blocksizes"].split(",")]
            continue
        if first != "blockname" or set(entry) - {"blockname", "nodes"}:
            problems.append(f"not a block line: {entry}")
            continue
        if "nodes" not in entry:
            problems.append(f"block {entry['blockname']} hasn't got nodes")
            continue
        if entry["blockname"] in names:
            problems.append(f"Block ({entry['blockname']}) has already been defined")
        names.add(entry["blockname"])
        nodes = expand(entry["nodes"])
        if seen & set(nodes):
            problems.append(f"nodes in two blocks: {sorted(seen & set(nodes))}")
        seen |= set(nodes)
        counts.append(len(nodes))
    base = sizes[0] if sizes else (counts[0] if counts else 0)
    problems += [f"block of {n} < base {base}" for n in counts if n < base]
    for previous, size in zip([base, *sizes], sizes[1:] + [None], strict=False):
        if size is None:
            break
        ratio = size / base
        if size <= previous or ratio != int(ratio) or int(ratio) & (int(ratio) - 1) \
                or int(ratio) > 1 << 15:
            problems.append(f"BlockSizes {size} is not a power of two above {previous}")
    return problems


def check_tree_conf(text: str) -> list[str]:
    problems, names = [], set()
    for entry in conf_lines(text):
        first = entry.pop("_first").lower()
        kinds = set(entry) - {"switchname", "linkspeed"}
        if first != "switchname" or kinds not in ({"nodes"}, {"switches"}):
            problems.append(f"SwitchName needs exactly one of Nodes/Switches: {entry}")
        if len(entry["switchname"]) > 64 or entry["switchname"] in names:
            problems.append(f"bad or duplicate SwitchName {entry['switchname']}")
        names.add(entry["switchname"])
    return problems


def test_checkers_catch_what_the_man_page_forbids() -> None:
    assert check_block_conf("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-6]\n")
    assert check_block_conf("BlockName=b1\n")
    assert check_block_conf("BlockName=b1 Nodes=n[1-4]\nBlockName=b1 Nodes=n[5-8]\n")
    assert check_block_conf("BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,12\n")
    assert check_block_conf("BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,4\n")
    assert not check_block_conf("BlockName=block1 Nodes=node[1-32]\nBlockName=block2 "
                                "Nodes=node[33-64]\nBlockSizes=30,120\n")   # the man page's
    assert check_tree_conf("SwitchName=s0 Nodes=a Switches=s1\n")


# -- topology.conf ---------------------------------------------------------------------------


def test_tree_conf_for_the_fat_tree() -> None:
    plan = plan_tree(fleet_of())
    assert tree_conf(plan) == (
        "# topology.conf for TopologyPlugin=topology/tree, written by provisioner\n"
        "SwitchName=ib-leaf-01 Nodes=gpu-node-[01-04]\n"
        "SwitchName=ib-leaf-02 Nodes=gpu-node-[05-08]\n"
        "SwitchName=ib-leaf-03 Nodes=gpu-node-[09-12]\n"
        "SwitchName=ib-leaf-04 Nodes=gpu-node-[13-16]\n"
        "SwitchName=ib-spine-01 Switches=ib-leaf-[01-04]\n"
        "SwitchName=ib-spine-02 Switches=ib-leaf-[01-04]\n")


@pytest.mark.parametrize("relative", ["infiniband-sim/faults/ibnetdiscover.txt",
                                      "infiniband/topograph-ibnetdiscover-example.out",
                                      "infiniband/treydock-ibnetdiscover-ports-test.out"])
def test_tree_conf_grammar_on_fixtures(relative: str) -> None:
    text = tree_conf(plan_tree(fleet_of(relative)), source=relative)
    assert not check_tree_conf(text)


def test_block_conf_per_leaf_without_nvlink() -> None:
    plan = plan_blocks(fleet_of())
    text = block_conf(plan)
    assert "BlockName=ib-leaf-03 Nodes=gpu-node-[09-12]" in text
    assert text.rstrip().endswith("BlockSizes=4,8,16")
    assert not check_block_conf(text)


def test_block_conf_per_nvlink_clique() -> None:
    plan = plan_blocks(fleet_of(gpus=True))
    assert [(b.name, len(b.nodes)) for b in plan.blocks] == [
        (f"{CLUSTER_A}.1", 8), (f"{CLUSTER_A}.2", 4), ("ib-leaf-04", 4)]
    assert plan.sizes == (4, 8) and not check_block_conf(block_conf(plan))


def test_partial_blocks_are_left_out() -> None:
    plan = plan_blocks(fleet_of(gpus=True), block_size=8)
    assert [b.name for b in plan.blocks] == [f"{CLUSTER_A}.1"]
    assert sorted(f.subject for f in plan.findings if f.code is Code.BLOCK_TOO_SMALL) == [
        "gpu-node-[09-12]", "gpu-node-[13-16]"]
    assert plan.sizes == (8,) and not check_block_conf(block_conf(plan))


@pytest.mark.parametrize("relative", ["infiniband/topograph-ibnetdiscover-example.out",
                                      "infiniband-sim/faults/ibnetdiscover.txt"])
def test_block_conf_grammar_on_fixtures(relative: str) -> None:
    for size in (None, 4, 16):
        assert not check_block_conf(block_conf(plan_blocks(fleet_of(relative), size)))


def test_nothing_placed_gives_no_lines() -> None:
    fleet = fleet_of("infiniband/topograph-ibnetdiscover-example-bad.out")
    assert not plan_tree(fleet).switches and plan_tree(fleet).findings
    assert not plan_blocks(fleet).blocks and "BlockName" not in block_conf(plan_blocks(fleet))


# -- topology.yaml ---------------------------------------------------------------------------


def test_topology_yaml_tree_and_block() -> None:
    fleet = fleet_of(gpus=True)
    document = yaml.safe_load(topology_yaml(plan_tree(fleet), plan_blocks(fleet), "block"))
    assert [(t["topology"], t["cluster_default"]) for t in document] == [
        ("default", True), ("tree", False)]
    block, tree = document
    assert list(block) == ["topology", "cluster_default", "block"]   # topology comes first
    assert block["block"]["block_sizes"] == [4, 8]
    assert block["block"]["blocks"][0] == {"block": f"{CLUSTER_A}.1", "nodes": "gpu-node-[01-08]"}
    switches = tree["tree"]["switches"]
    assert switches[0] == {"switch": "ib-spine-02", "children": "ib-leaf-[01-04]"}
    assert {"switch": "ib-leaf-01", "nodes": "gpu-node-[01-04]"} in switches
    assert all(len(s["switch"]) <= 64 and ("nodes" in s) != ("children" in s) for s in switches)


def test_yaml_quotes_what_yaml_would_misread() -> None:
    from provisioner.topology.emit import Block, BlockPlan
    plan = BlockPlan((Block("true", ("n1",), "leaf true"), Block("1e3", ("n2",), "x")), (1,))
    document = yaml.safe_load(topology_yaml(None, plan, "block"))
    assert [b["block"] for b in document[0]["block"]["blocks"]] == ["true", "1e3"]


# -- Kubernetes -----------------------------------------------------------------------------


def fnv1a64(data: bytes) -> int:
    """The reference definition (IETF draft-eastlake-fnv), written out independently."""
    digest = 0xCBF29CE484222325
    for byte in data:
        digest = ((digest ^ byte) * 0x100000001B3) % (1 << 64)
    return digest


def test_fnv1a_reference_vectors() -> None:
    assert f"{fnv1a64(b''):x}" == "cbf29ce484222325"
    assert f"{fnv1a64(b'a'):x}" == "af63dc4c8601ec8c"
    assert f"{fnv1a64(b'foobar'):x}" == "85944171f73967e8"


@pytest.mark.parametrize("value", ["ib-leaf-01", "a" * 63, "a" * 64, "é" * 32, "x" * 300,
                                   f"{CLUSTER_A}.1"])
def test_topograph_value(value: str) -> None:
    got = topograph_value(value)
    if len(value.encode()) <= 63:      # Go's len() counts bytes
        assert got == value
    else:
        assert got == f"x{fnv1a64(value.encode()):x}" and len(got) <= 17


def test_topograph_labels() -> None:
    labels = topograph_labels(fleet_of(gpus=True))
    assert labels["gpu-node-09"] == {TOPOGRAPH_DOMAIN: f"{CLUSTER_A}.2",
                                     "fabric.topograph.run/tier-0": "ib-leaf-03",
                                     "fabric.topograph.run/tier-1": "ib-spine-01"}
    assert TOPOGRAPH_DOMAIN not in labels["gpu-node-13"]
    assert all(LABEL_VALUE.match(v) for node in labels.values() for v in node.values())


def test_topograph_labels_hash_long_switch_names() -> None:
    text = (FIXTURES / "infiniband-sim/healthy/ibnetdiscover.txt").read_text().replace(
        '"ib-spine-01"', '"MF0;a' + "s" * 63 + ':MQM9790/U1"')   # 64: Slurm's maximum
    labels = topograph_labels(build_fleet(build_fabric(parse_ibnetdiscover(text))))
    tier1 = labels["gpu-node-01"]["fabric.topograph.run/tier-1"]
    assert tier1 == f"x{fnv1a64(b'a' + b's' * 63):x}" and LABEL_VALUE.match(tier1)


def test_slinky_annotations() -> None:
    fleet = fleet_of(gpus=True)
    assert SLINKY_ANNOTATION == "topology.slinky.slurm.net/spec"
    blocks = slinky_annotations(fleet, blocks=plan_blocks(fleet))
    assert blocks["gpu-node-01"] == f"default:{CLUSTER_A}.1"
    assert blocks["gpu-node-16"] == "default:ib-leaf-04"
    tree = slinky_annotations(fleet, tree=plan_tree(fleet))
    assert tree["gpu-node-10"] == "default:ib-spine-01:ib-leaf-03"
    assert len(tree) == 16
    partial = slinky_annotations(fleet, blocks=plan_blocks(fleet, block_size=8))
    assert "gpu-node-09" not in partial and "gpu-node-08" in partial


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(["gpu-node-01", "gpu-node-05", "x,y", "", "n[1]",
                                           "gpu-node-99", "GPU-NODE-03"]),
                          st.lists(st.builds(nvsmi.FakeGpu, st.text(max_size=12),
                                             st.sampled_from(["Completed", "In Progress", "?"]),
                                             st.sampled_from(["Success", "Failure"]),
                                             st.sampled_from([CLUSTER_A, "", "a,b[", nvsmi.ZERO]),
                                             st.text(max_size=4)), max_size=3)),
                max_size=6),
       st.none() | st.integers(1, 40))
def test_emitters_are_total(hosts: list[tuple[str, list[nvsmi.FakeGpu]]],
                            block_size: int | None) -> None:
    fabric = build_fabric(parse_ibnetdiscover(
        (FIXTURES / "infiniband-sim/faults/ibnetdiscover.txt").read_text()))
    reports = [GpuReport(host, tuple(Gpu(g.uuid, g.product, fabric_state=g.state,
                                         fabric_status=g.status, cluster_uuid=g.cluster,
                                         clique_id=g.clique) for g in gpus))
               for host, gpus in hosts]
    fleet = build_fleet(fabric, reports)
    tree, blocks = plan_tree(fleet), plan_blocks(fleet, block_size)
    assert not check_tree_conf(tree_conf(tree))
    assert not check_block_conf(block_conf(blocks))
    yaml.safe_load(topology_yaml(tree, blocks))
    for labels in topograph_labels(fleet).values():
        assert all(LABEL_VALUE.match(v) and len(v) <= 63 for v in labels.values())
    slinky_annotations(fleet, tree=tree)
    slinky_annotations(fleet, blocks=blocks)
