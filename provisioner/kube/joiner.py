"""``KubeJoiner`` for the lifecycle's ``joining`` step, composed of join, labels, wait and drain.

join(node): unless the node's Node object already exists, create a bootstrap token, run the
``kubeadm join`` playbook (injected ``run_join``) and delete the token; wait for the Node;
label/annotate/taint it from its profile (GPU operands held until the node passed validation,
which comes after ``joining``); wait for ``Ready``. The Slurm hand-off releases the operands
and waits for the GPU stack (``release_operands``). Every part is idempotent, so running the
step again on a joined, labelled node succeeds at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from provisioner.config import KubeProfile, KubeSettings
from provisioner.domain import Node
from provisioner.kube.drain import DrainClient, Drainer, uncordon
from provisioner.kube.join import BootstrapTokens, RunJoin, SecretStore
from provisioner.kube.labels import apply_metadata, desired_metadata
from provisioner.kube.model import NodeInfo
from provisioner.kube.wait import NodeWaiter, exists, gpu_stack_ready, node_name, ready

log = logging.getLogger(__name__)


class JoinClient(DrainClient, SecretStore, Protocol):
    async def find_node(self, name: str) -> NodeInfo | None: ...

    async def delete_node(self, name: str) -> bool: ...


class KubeNodeJoiner:
    def __init__(self, client: JoinClient, settings: KubeSettings, run_join: RunJoin, *,
                 validated: Callable[[Node], bool],
                 topology_labels: Callable[[Node], Mapping[str, str]] = lambda node: {},
                 now: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._client = client
        self._settings = settings
        self._run_join = run_join
        self._validated = validated
        self._topology_labels = topology_labels
        self._tokens = BootstrapTokens(client, ttl_s=settings.token_ttl_s)
        self._waiter = NodeWaiter(client, poll_interval_s=settings.poll_interval_s,
                                  now=now, sleep=sleep)
        self._drainer = Drainer(client, timeout_s=settings.drain_timeout_s,
                                backoff_s=settings.eviction_backoff_s,
                                poll_interval_s=settings.poll_interval_s, now=now, sleep=sleep)

    def profile(self, node: Node) -> KubeProfile:
        return self._settings.profiles.get(node.profile or "", KubeProfile())

    async def join(self, node: Node) -> None:
        name = node_name(node)
        info = await self._client.find_node(name)
        if info is None:
            async with self._tokens.ticket(node) as ticket:
                # kubeadm join returns once the kubelet's TLS bootstrap is done: the token
                # is deleted right after, not when the Node shows up.
                await self._run_join(ticket, node)
            info = await self._waiter.until(name, exists(node), what="registered",
                                            timeout_s=self._settings.join_timeout_s)
        else:
            exists(node)(info)  # same hostname, other machine → FatalError
            log.info("node %s: Node %s already registered", node.id, name)
        await self.label(node, info)
        await self._waiter.until(name, ready, what="Ready",
                                 timeout_s=self._settings.ready_timeout_s)

    async def label(self, node: Node, info: NodeInfo | None = None) -> NodeInfo:
        """Apply the node's labels/annotations/taints (operands held unless validated)."""
        profile = self.profile(node)
        desired = desired_metadata(node, profile, validated=self._validated(node),
                                   extra_labels=self._topology_labels(node))
        info = info or await self._client.get_node(node_name(node))
        return await apply_metadata(self._client, info, desired)

    async def release_operands(self, node: Node) -> None:
        """Validation passed: let the GPU Operator deploy, then wait for the GPU stack."""
        profile = self.profile(node)
        desired = desired_metadata(node, profile, validated=True,
                                   extra_labels=self._topology_labels(node))
        info = await self._client.get_node(node_name(node))
        await apply_metadata(self._client, info, desired)
        await self.wait_gpu_stack(node)

    async def wait_gpu_stack(self, node: Node) -> None:
        profile = self.profile(node)
        if profile.gpu:
            await self._waiter.until(node_name(node), gpu_stack_ready(profile),
                                     what="GPU-ready",
                                     timeout_s=self._settings.gpu_ready_timeout_s)

    async def observe(self, node: Node) -> tuple[NodeInfo | None, dict[str, str]]:
        """The node's Node as the API server has it now (None: not registered) and the
        labels ``label`` gives it (``provisioner node why``)."""
        desired = desired_metadata(node, self.profile(node), validated=self._validated(node),
                                   extra_labels=self._topology_labels(node))
        return await self._client.find_node(node_name(node)), desired.labels

    async def maintenance(self, node: Node, on: bool, reason: str = "maintenance") -> None:
        """On: cordon and drain. Off: uncordon."""
        if on:
            await self._drainer.drain(node_name(node), reason)
        else:
            await uncordon(self._client, node_name(node))

    async def remove(self, node: Node) -> None:
        """Retire: drain, then delete the Node object (gone already = success)."""
        if not node.hostname:
            return  # never joined
        name = node_name(node)
        if await self._client.find_node(name) is None:
            return
        await self._drainer.drain(name, "retire")
        if await self._client.delete_node(name):
            log.info("node %s: Node %s deleted", node.id, name)
