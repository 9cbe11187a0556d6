"""Slurm outputs from a ``Fleet``: ``topology.conf`` (topology/tree and topology/block) and
``topology.yaml`` (Slurm >= 25.05); then Topograph's node labels and Slinky's annotation.
Pure; host and switch lists are hostlist-compressed.

Tree: one line per *leaf* holding some host's primary leaf (fleet.py), then every upper
switch with those of its fabric children that are emitted (a fat tree is a DAG: each spine
lists its leaves). A switch never has both ``Nodes=`` and ``Switches=`` (Slurm refuses that).

Block (topology.conf(5): "Each block must have at least the planning base block size count
of nodes. Successive BlockSizes must be a power of two larger than the prior values"): one
block per NVLink clique, or per leaf for hosts without a clique; blocks are ordered by leaf
name so that neighbouring blocks (which Slurm aggregates) are close. The base size is the
caller's or the smallest block; blocks below it are left out with a finding (a partial NVL72
rack takes no multi-node job); BlockSizes adds the base's power-of-two multiples up to the
number of blocks.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass

from provisioner.topology.hostlist import compress
from provisioner.topology.model import Code, Finding, Fleet, Node, Severity

TOPOLOGY_NAME = "default"
_BLOCK_NAME = re.compile(r"[^A-Za-z0-9._-]")
_YAML_PLAIN = re.compile(r"^[A-Za-z][A-Za-z0-9._\-\[\],]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


@dataclass(frozen=True, slots=True)
class TreeSwitch:
    name: str
    tier: int
    nodes: tuple[str, ...] = ()
    children: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TreePlan:
    switches: tuple[TreeSwitch, ...]   # leaves first, then upward
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True, slots=True)
class Block:
    name: str
    nodes: tuple[str, ...]
    reason: str          # "NVLink clique <id>" or "leaf <switch>"


@dataclass(frozen=True, slots=True)
class BlockPlan:
    blocks: tuple[Block, ...]
    sizes: tuple[int, ...]            # BlockSizes: the base, then powers of two above it
    findings: tuple[Finding, ...] = ()


def plan_tree(fleet: Fleet) -> TreePlan:
    leaves: dict[str, list[str]] = defaultdict(list)
    findings = []
    for node in fleet.nodes:
        if node.leaf:
            leaves[node.leaf].append(node.hostname)
        else:
            findings.append(Finding(Code.NO_LEAF, node.hostname, "not in the tree: no leaf"))
    emitted = [TreeSwitch(name, 1, nodes=tuple(sorted(hosts)))
               for name, hosts in sorted(leaves.items())]
    below = set(leaves)
    switches = fleet.fabric.switches if fleet.fabric else ()
    for tier in sorted({s.tier for s in switches if s.tier and s.tier > 1}):
        level = [TreeSwitch(s.name, tier, children=tuple(c for c in s.children if c in below))
                 for s in switches if s.tier == tier]
        level = [s for s in level if s.children]
        emitted += level
        below = {s.name for s in level}
    return TreePlan(tuple(emitted), tuple(findings))


def tree_conf(plan: TreePlan, source: str = "") -> str:
    lines = _header("topology/tree", source)
    for switch in plan.switches:
        members = (f"Nodes={compress(switch.nodes)}" if switch.nodes
                   else f"Switches={compress(switch.children)}")
        lines.append(f"SwitchName={switch.name} {members}")
    return "\n".join(lines) + "\n"


def plan_blocks(fleet: Fleet, block_size: int | None = None) -> BlockPlan:
    groups: dict[tuple[str, str], list[Node]] = defaultdict(list)
    findings = []
    for node in fleet.nodes:
        if node.clique:
            groups["clique", node.clique].append(node)
        elif node.leaf:
            groups["leaf", node.leaf].append(node)
        else:
            findings.append(Finding(Code.NO_LEAF, node.hostname,
                                    "in no block: no NVLink clique and no leaf"))
    if not groups:
        return BlockPlan((), (), tuple(findings))
    base = block_size or min(len(members) for members in groups.values())
    blocks = []
    for (kind, key), members in sorted(groups.items(), key=_block_order):
        hosts = tuple(sorted(n.hostname for n in members))
        reason = f"NVLink clique {key}" if kind == "clique" else f"leaf {key}"
        if len(hosts) < base:
            findings.append(Finding(Code.BLOCK_TOO_SMALL, compress(hosts),
                                    f"{reason}: {len(hosts)} nodes < block size {base}",
                                    Severity.WARNING))
            continue
        blocks.append(Block(_BLOCK_NAME.sub("_", key), hosts, reason))
    sizes = tuple(base << k for k in range(16) if (1 << k) <= max(len(blocks), 1))
    return BlockPlan(tuple(blocks), sizes, tuple(findings))


def _block_order(item: tuple[tuple[str, str], list[Node]]) -> tuple[str, str]:
    """Blocks under the same leaf (and leaves named alike) next to each other."""
    (_, key), members = item
    return min(n.leaf or "" for n in members), key


def block_conf(plan: BlockPlan, source: str = "") -> str:
    lines = _header("topology/block", source)
    for block in plan.blocks:
        lines.append(f"# {block.reason}")
        lines.append(f"BlockName={block.name} Nodes={compress(block.nodes)}")
    if plan.sizes:
        lines.append(f"BlockSizes={','.join(str(size) for size in plan.sizes)}")
    return "\n".join(lines) + "\n"


def _header(plugin: str, source: str) -> list[str]:
    lines = [f"# topology.conf for TopologyPlugin={plugin}, written by provisioner"]
    if source:
        lines.append(f"# from {source}")
    return lines


def topology_yaml(tree: TreePlan | None, blocks: BlockPlan | None,
                  default: str = "tree") -> str:
    """topology.yaml(5): the ``default`` topology (``cluster_default: true``) is ``default``'s
    kind; the other one, when given, is named after its kind."""
    entries: list[tuple[str, list[str]]] = []
    if tree is not None:
        entries.append(("tree", _yaml_tree(tree)))
    if blocks is not None:
        entries.append(("block", _yaml_blocks(blocks)))
    entries.sort(key=lambda entry: entry[0] != default)
    lines = ["---"]
    for index, (kind, body) in enumerate(entries):
        lines.append(f"- topology: {TOPOLOGY_NAME if index == 0 else kind}")
        lines.append(f"  cluster_default: {'true' if index == 0 else 'false'}")
        lines.extend(body)
    return "\n".join(lines) + "\n"


def _yaml_tree(plan: TreePlan) -> list[str]:
    lines = ["  tree:", "    switches:"]
    for switch in reversed(plan.switches):
        lines.append(f"      - switch: {_scalar(switch.name)}")
        if switch.nodes:
            lines.append(f"        nodes: {_scalar(compress(switch.nodes))}")
        else:
            lines.append(f"        children: {_scalar(compress(switch.children))}")
    return lines


def _yaml_blocks(plan: BlockPlan) -> list[str]:
    lines = ["  block:", "    block_sizes:"]
    lines += [f"      - {size}" for size in plan.sizes]
    lines.append("    blocks:")
    for block in plan.blocks:
        lines.append(f"      - block: {_scalar(block.name)}")
        lines.append(f"        nodes: {_scalar(compress(block.nodes))}")
    return lines


def _scalar(value: str) -> str:
    if _YAML_PLAIN.match(value) and value.lower() not in _YAML_WORDS:
        return value
    return json.dumps(value)


def block_of(plan: BlockPlan) -> dict[str, str]:
    return {host: block.name for block in plan.blocks for host in block.nodes}


def tree_path(plan: TreePlan, node: Node, emitted: set[str] | None = None) -> tuple[str, ...]:
    """The node's path restricted to emitted switches, top first (Slinky's tree unit)."""
    emitted = emitted if emitted is not None else {s.name for s in plan.switches}
    path: list[str] = []
    for name in node.path:
        if name not in emitted:
            break
        path.append(name)
    return tuple(reversed(path))


# -- Kubernetes: Topograph labels and the Slinky annotation ---------------------------------

TOPOGRAPH_DOMAIN = "accelerator.topograph.run/domain"
TOPOGRAPH_TIER = "fabric.topograph.run/tier-"
SLINKY_ANNOTATION = "topology.slinky.slurm.net/spec"
_FNV_OFFSET, _FNV_PRIME, _U64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def topograph_value(value: str) -> str:
    """A label value as NVIDIA Topograph writes it: kept up to 63 bytes, else ``x`` and the
    FNV-1a 64-bit hash in lower-case hex, unpadded. Matches ``checkLabel`` in
    NVIDIA/topograph pkg/engines/k8s/labeler.go (commit 241235aaa522f26953c51305e5d0f49f55db1031:
    ``h := fnv.New64a(); h.Write([]byte(val)); v = fmt.Sprintf("x%x", h.Sum64())``)."""
    data = value.encode()
    if len(data) <= 63:
        return value
    digest = _FNV_OFFSET
    for byte in data:
        digest = ((digest ^ byte) * _FNV_PRIME) & _U64
    return f"x{digest:x}"


def topograph_labels(fleet: Fleet) -> dict[str, dict[str, str]]:
    """``{hostname: {label: value}}``: the NVLink domain and one ``tier-N`` per switch of the
    node's path, tier 0 = its leaf (Topograph: "fabric tier zero is closest to the node")."""
    labels: dict[str, dict[str, str]] = {}
    for node in fleet.nodes:
        mine: dict[str, str] = {}
        if node.clique:
            mine[TOPOGRAPH_DOMAIN] = topograph_value(node.clique)
        for tier, switch in enumerate(node.path):
            mine[f"{TOPOGRAPH_TIER}{tier}"] = topograph_value(switch)
        labels[node.hostname] = mine
    return labels


def slinky_annotations(fleet: Fleet, tree: TreePlan | None = None,
                       blocks: BlockPlan | None = None) -> dict[str, str]:
    """``{hostname: value}`` for ``topology.slinky.slurm.net/spec`` (DESIGN §6): Slurm's
    ``Topology=<topology>:<unit>``, the unit being the node's block (``default:<block>``) or
    its switch path from the top down to its leaf (``default:<spine>:<leaf>``). Nodes
    outside the plan get no annotation."""
    values: dict[str, str] = {}
    if blocks is not None:
        for host, block in block_of(blocks).items():
            values[host] = f"{TOPOLOGY_NAME}:{block}"
    elif tree is not None:
        emitted = {s.name for s in tree.switches}
        for node in fleet.nodes:
            if path := tree_path(tree, node, emitted):
                values[node.hostname] = f"{TOPOLOGY_NAME}:{':'.join(path)}"
    return dict(sorted(values.items()))
