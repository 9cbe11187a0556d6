"""``SlurmRegistrar`` for the ``registering`` step: the hand-off to Slurm through Slinky.

register(node), on Kubernetes: release the GPU operand hold (``nvidia.com/gpu.deploy.operands``
removed), optionally wait for the GPU stack, then set the label the Slinky NodeSet's
``nodeSelector`` matches and the topology annotation ``topology.slinky.slurm.net/spec``;
Slinky then starts ``slurmd -Z`` on the node. Everywhere: wait until Slurm reports the node
registered (present, not DOWN/FUTURE/UNKNOWN, not NOT_RESPONDING/INVALID_REG). The step ends
only then (DESIGN.md §2), never when a request was merely sent.

maintenance(node, on, reason): on → cordon with ``nodeset.slinky.slurm.net/node-cordon-reason``
(Slinky drains the Slurm node), DRAIN in Slurm directly too when configured, and wait until
Slurm reports it drained (no job left): only then may the caller evict the pods. Off → resume
in Slurm, uncordon. remove(node): drain, wait, remove the label, delete the dynamic node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from provisioner.config import SlurmSettings
from provisioner.domain import Node
from provisioner.errors import FatalError
from provisioner.kube.model import ANNOTATION_CORDON, LABEL_OPERANDS, NodeInfo
from provisioner.kube.sync import SLINKY_CORDON_REASON
from provisioner.kube.wait import node_name
from provisioner.slurm.agree import (
    inventory,
    kube_disagreement,
    merge_conf,
    slurm_disagreement,
    slurmd_conf,
    validated_clique,
)
from provisioner.slurm.model import SlurmClient, SlurmNode, SlurmTimeout

log = logging.getLogger(__name__)
SLINKY_TOPOLOGY = "topology.slinky.slurm.net/spec"
SLINKY_REASON_PREFIX = "slurm-operator:"  # Slinky's DRAIN reasons (DESIGN.md §6)


class KubeNodes(Protocol):
    async def find_node(self, name: str) -> NodeInfo | None: ...

    async def patch_node(self, name: str, body: Any) -> NodeInfo: ...


class NodeSets(Protocol):
    """Slinky NodeSets' ``spec.extraConf`` (the dynamic slurmd's ``--conf``)."""

    async def nodeset_extra_conf(self, namespace: str, name: str) -> str | None: ...

    async def set_nodeset_extra_conf(self, namespace: str, name: str, conf: str) -> None: ...


def no_topology(node: Node) -> str | None:
    """Default topology: none known, so no annotation."""
    return None


def slurm_node_name(node: Node) -> str:
    """The Slurm node name: the hostname, as Slinky's slurmd registers it."""
    return node_name(node)


class SlurmHandoff:
    def __init__(self, slurm: SlurmClient, settings: SlurmSettings, *,
                 kube: KubeNodes | None = None,
                 topology_spec: Callable[[Node], str | None] = no_topology,
                 gpu_ready: Callable[[Node], Awaitable[None]] | None = None,
                 nodesets: NodeSets | None = None,
                 now: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._slurm = slurm
        self._settings = settings
        self._kube = kube
        self._topology_spec = topology_spec
        self._gpu_ready = gpu_ready
        self._nodesets = nodesets
        self._now = now
        self._sleep = sleep

    def nodeset(self, node: Node) -> str:
        if not node.profile:
            raise FatalError(f"node {node.id} has no profile: no Slinky NodeSet to hand it to")
        return self._settings.nodesets.get(node.profile, node.profile)

    def reason(self, text: str) -> str:
        prefix = self._settings.reason_prefix
        return text if text.startswith(prefix) else prefix + text

    async def register(self, node: Node) -> None:
        name = slurm_node_name(node)
        if self._kube is not None:
            await self.hand_off(node)
        found = await self._wait(name, _registered, "registered",
                                 self._settings.register_timeout_s)
        if self._settings.verify_gres:
            await self._agree(node, name, found)
        if found.draining and found.reason.startswith(self._settings.reason_prefix) \
                and not node.maintenance:
            await self._slurm.resume(name)  # our drain from before (retire, maintenance)
        log.info("node %s: Slurm node %s registered (%s)", node.id, name, found.state_text)

    async def _agree(self, node: Node, name: str, found: SlurmNode) -> None:
        """The registration proof (``agree.py``): Slurm's Gres and Kubernetes' GPU labels
        and allocatable against the node's GPUs; a disagreement holds the node."""
        have = inventory(node.facts)
        problems = slurm_disagreement(have, found.gres,
                                      types=[t for t in [self._site_type(node)] if t])
        if self._kube is not None and have.gpus:
            info = await self._kube.find_node(node_name(node))
            if info is not None:
                problems += kube_disagreement(have, info.labels, info.allocatable,
                                              validated_clique(node.facts))
        if problems:
            raise FatalError(f"Slurm node {name} registered, but " + "; ".join(problems))

    def _site_type(self, node: Node) -> str | None:
        """The GRES type the site configured for the node's profile (``slurm.gres_types``)."""
        return self._settings.gres_types.get(node.profile or "")

    async def hand_off(self, node: Node) -> NodeInfo:
        """Release the operands, then the NodeSet label and topology annotation."""
        name = node_name(node)
        info = await self._node_info(name)
        if LABEL_OPERANDS in info.labels:
            info = await self._patch(name, {"metadata": {"labels": {LABEL_OPERANDS: None}}})
        if self._gpu_ready is not None:
            await self._gpu_ready(node)
        await self.write_gres(node)
        labels = {self._settings.nodeset_label: self.nodeset(node)}
        annotations = {}
        if (spec := self._topology_spec(node)) is not None:
            annotations[SLINKY_TOPOLOGY] = spec
        metadata: dict[str, Any] = {}
        if any(info.labels.get(k) != v for k, v in labels.items()):
            metadata["labels"] = labels
        if any(info.annotations.get(k) != v for k, v in annotations.items()):
            metadata["annotations"] = annotations
        if metadata:
            info = await self._patch(name, {"metadata": metadata})
            log.info("node %s: handed to Slinky NodeSet %s", node.id, labels)
        return info

    async def write_gres(self, node: Node) -> None:
        """Put what the node has (``Gres=gpu:<type>:<count> Feature=<nodeset>,<type>``) in
        its NodeSet's ``extraConf`` (``slurm.nodeset_namespace`` set; the NodeSet is named
        like the label value), so Slinky's slurmd registers it; the type is the profile's in
        ``slurm.gres_types``, else the short one. The nodes of one NodeSet
        share a profile, whose hardware the SKU gate checked."""
        namespace = self._settings.nodeset_namespace
        have = inventory(node.facts)
        if self._nodesets is None or namespace is None or not have.gpus:
            return
        name = self.nodeset(node)
        existing = await self._nodesets.nodeset_extra_conf(namespace, name)
        if existing is None:
            raise FatalError(f"no Slinky NodeSet {namespace}/{name} to write Gres into")
        wanted = merge_conf(existing, slurmd_conf(have, [name], self._site_type(node)))
        if wanted != existing:
            await self._nodesets.set_nodeset_extra_conf(namespace, name, wanted)
            log.info("node %s: NodeSet %s/%s extraConf: %s", node.id, namespace, name, wanted)

    async def maintenance(self, node: Node, on: bool, reason: str = "maintenance") -> None:
        """On: cordon (Slinky drains), DRAIN in Slurm, wait until drained. Off: the reverse."""
        name = slurm_node_name(node)
        if on:
            if self._kube is not None:
                await self._cordon(name, reason)
            direct = self._kube is None or self._settings.drain_directly
            if direct and await self._slurm.node(name) is not None:
                await self._slurm.drain(name, self.reason(reason))
            await self.wait_drained(name)
        else:
            await self._slurm.resume(name)
            if self._kube is not None:
                await self._uncordon(name)

    async def drain_for_repair(self, node: Node, reason: str, wait_s: float) -> str:
        """The repair ladder's drain: cordon (with Slinky's reason), DRAIN in Slurm with the
        same text, and let running jobs end for up to ``wait_s``; "" when none is left,
        else what Slurm still reports (the ladder goes on: the node is broken)."""
        name = slurm_node_name(node)
        text = self.reason(reason)
        if self._kube is not None and await self._kube.find_node(name) is not None:
            await self._cordon(name, text)
        if await self._slurm.node(name) is None:
            return ""
        await self._slurm.drain(name, text)
        try:
            await self._wait(name, _drained, "drained", wait_s, missing_ok=True)
        except SlurmTimeout as exc:
            return str(exc)
        return ""

    async def wait_drained(self, name: str) -> None:
        """Until Slurm reports the node drained and idle (a node Slurm does not know is)."""
        await self._wait(name, _drained, "drained", self._settings.drain_timeout_s,
                         missing_ok=True)

    async def remove(self, node: Node) -> None:
        """Retire: drain and wait, remove the NodeSet label, delete the dynamic node."""
        if not node.hostname:
            return  # never registered
        name = slurm_node_name(node)
        found = await self._slurm.node(name)
        if found is not None:
            if not found.draining:
                await self._slurm.drain(name, self.reason("retire"))
            await self.wait_drained(name)
        info = await self._kube.find_node(name) if self._kube is not None else None
        if info is not None and (self._settings.nodeset_label in info.labels
                                 or SLINKY_CORDON_REASON in info.annotations):
            await self._patch(name, {"metadata": {
                "labels": {self._settings.nodeset_label: None},
                "annotations": {SLINKY_CORDON_REASON: None}}})
        if found is not None and await self._slurm.delete(name):
            log.info("node %s: Slurm node %s deleted", node.id, name)

    async def _cordon(self, name: str, reason: str) -> None:
        info = await self._node_info(name)
        if info.unschedulable and info.annotations.get(SLINKY_CORDON_REASON) == reason:
            return
        # ANNOTATION_CORDON with the same text: kube/sync.py sees the cordon is ours, and
        # the Drainer's own cordon after us is a no-op.
        await self._patch(name, {"spec": {"unschedulable": True}, "metadata": {"annotations": {
            SLINKY_CORDON_REASON: reason, ANNOTATION_CORDON: reason}}})

    async def _uncordon(self, name: str) -> None:
        info = await self._node_info(name)
        if not info.unschedulable and SLINKY_CORDON_REASON not in info.annotations \
                and ANNOTATION_CORDON not in info.annotations:
            return
        await self._patch(name, {"spec": {"unschedulable": None}, "metadata": {"annotations": {
            SLINKY_CORDON_REASON: None, ANNOTATION_CORDON: None}}})

    async def _node_info(self, name: str) -> NodeInfo:
        assert self._kube is not None
        info = await self._kube.find_node(name)
        if info is None:
            raise FatalError(f"no Kubernetes Node {name} to hand to Slinky")
        return info

    async def _patch(self, name: str, body: dict[str, Any]) -> NodeInfo:
        assert self._kube is not None
        return await self._kube.patch_node(name, body)

    async def _wait(self, name: str, check: Callable[[SlurmNode | None], str | None],
                    what: str, timeout_s: float, *, missing_ok: bool = False) -> SlurmNode:
        deadline = self._now() + timeout_s
        while True:
            found = await self._slurm.node(name)
            missing = check(found)
            if missing is None and found is not None:
                return found
            if missing is None or (found is None and missing_ok):
                return SlurmNode(name=name, state="UNKNOWN")
            if self._now() >= deadline:
                raise SlurmTimeout(f"Slurm node {name}: not {what} after {timeout_s:g} s: "
                                   f"{missing}")
            await self._sleep(min(self._settings.poll_interval_s,
                                  max(deadline - self._now(), 0.0)))


def _registered(found: SlurmNode | None) -> str | None:
    if found is None:
        return "not known to slurmctld"
    return found.not_registered_because()


def _drained(found: SlurmNode | None) -> str | None:
    if found is None:
        return "not known to slurmctld"
    if not found.draining:
        return f"not draining (state {found.state_text})"
    return None if found.drained else f"jobs still running (state {found.state_text})"
