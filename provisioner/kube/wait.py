"""Waits on a Node: its object (matched by hostname, and by serial/MAC where it carries one),
then ``Ready``, then the GPU stack. Polls through the rate-limited client; a timeout names
what is still missing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from provisioner.config import KubeProfile
from provisioner.domain import Node
from provisioner.errors import FatalError
from provisioner.kube.model import (
    ANNOTATION_SERIAL,
    LABEL_GPU_CLIQUE,
    LABEL_GPU_COUNT,
    PROVIDER_ID_SCHEME,
    RESOURCE_GPU,
    KubeTimeout,
    NodeInfo,
)

# A check returns None when satisfied, else what is missing (ends up in the timeout message).
Check = Callable[[NodeInfo | None], str | None]


class NodeReader(Protocol):
    async def find_node(self, name: str) -> NodeInfo | None: ...


def node_name(node: Node) -> str:
    """The Node object's name kubeadm registers: the hostname, lower-case."""
    if not node.hostname:
        raise FatalError(f"node {node.id} has no hostname: it cannot join Kubernetes")
    return node.hostname.lower()


def identity_mismatch(info: NodeInfo, node: Node) -> str | None:
    """Why ``info`` is another machine's Node (same hostname), or None if it may be ours."""
    if info.provider_id.startswith(PROVIDER_ID_SCHEME):
        claimed = info.provider_id.removeprefix(PROVIDER_ID_SCHEME).lower()
        ours = {m.lower() for m in node.macs} | ({node.serial.lower()} if node.serial else set())
        if claimed not in ours:
            return f"providerID {info.provider_id} is not serial/MAC of node {node.id}"
    serial = info.annotations.get(ANNOTATION_SERIAL)
    if serial and node.serial and serial != node.serial:
        return f"annotation {ANNOTATION_SERIAL}={serial}, node {node.id} has serial {node.serial}"
    return None


def exists(node: Node) -> Check:
    def check(info: NodeInfo | None) -> str | None:
        if info is None:
            return "no Node object"
        if (why := identity_mismatch(info, node)) is not None:
            raise FatalError(f"Node {info.name} belongs to another machine: {why}")
        return None
    return check


def ready(info: NodeInfo | None) -> str | None:
    if info is None:
        return "no Node object"
    cond = info.condition("Ready")
    if cond is None:
        return "condition Ready not reported"
    if cond.status != "True":
        detail = ": ".join(part for part in (cond.reason, cond.message) if part)
        return f"condition Ready={cond.status}" + (f" ({detail})" if detail else "")
    return None


def gpu_stack_ready(profile: KubeProfile) -> Check:
    """DESIGN.md §6: allocatable nvidia.com/gpu > 0 and label nvidia.com/gpu.count;
    on multi-node NVLink also nvidia.com/gpu.clique."""
    def check(info: NodeInfo | None) -> str | None:
        if (missing := ready(info)) is not None or info is None:
            return missing
        wanted: list[str] = []
        if _quantity(info.allocatable.get(RESOURCE_GPU)) <= 0:
            wanted.append(f'status.allocatable["{RESOURCE_GPU}"] > 0')
        if LABEL_GPU_COUNT not in info.labels:
            wanted.append(f"label {LABEL_GPU_COUNT}")
        if profile.nvlink_multinode and LABEL_GPU_CLIQUE not in info.labels:
            wanted.append(f"label {LABEL_GPU_CLIQUE}")
        return ", ".join(wanted) or None
    return check


def _quantity(text: str | None) -> int:
    try:
        return int(text or "0")
    except ValueError:
        return 0


class NodeWaiter:
    def __init__(self, client: NodeReader, *, poll_interval_s: float,
                 now: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._client = client
        self._poll_s = poll_interval_s
        self._now = now
        self._sleep = sleep

    async def until(self, name: str, check: Check, *, timeout_s: float, what: str) -> NodeInfo:
        """Poll Node ``name`` until ``check`` passes; KubeTimeout names what is missing."""
        deadline = self._now() + timeout_s
        while True:
            info = await self._client.find_node(name)
            missing = check(info)
            if missing is None and info is not None:
                return info
            if self._now() >= deadline:
                raise KubeTimeout(f"node {name}: not {what} after {timeout_s:g} s: "
                                  f"missing {missing}")
            await self._sleep(min(self._poll_s, max(deadline - self._now(), 0.0)))
