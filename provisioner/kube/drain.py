"""Cordon, drain through the Eviction API, uncordon. DaemonSet and mirror pods stay; a
PodDisruptionBudget refusing (429) is retried with back-off until the deadline, then the
drain fails naming the budget."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from provisioner.kube.model import (
    ANNOTATION_CORDON,
    EvictionBlocked,
    KubeTimeout,
    NodeInfo,
    PodInfo,
)
from provisioner.retry import Backoff

log = logging.getLogger(__name__)
_MAX_BACKOFF_S = 60.0


class DrainClient(Protocol):
    async def get_node(self, name: str) -> NodeInfo: ...

    async def patch_node(self, name: str, body: Any) -> NodeInfo: ...

    async def list_pods(self, node_name: str) -> list[PodInfo]: ...

    async def evict_pod(self, namespace: str, name: str) -> bool: ...


class DrainTimeout(KubeTimeout):
    def __init__(self, node: str, timeout_s: float, blocked: dict[str, str],
                 waiting: list[str]) -> None:
        if blocked:
            budgets = ", ".join(sorted(set(blocked.values())))
            pods = ", ".join(sorted(blocked))
            detail = f"PodDisruptionBudget {budgets} still refuses eviction of {pods}"
        else:
            detail = f"pods still terminating: {', '.join(sorted(waiting))}"
        super().__init__(f"drain of node {node} not done after {timeout_s:g} s: {detail}")
        self.blocked = dict(blocked)


def evictable(pod: PodInfo) -> bool:
    """kubectl drain's rule: DaemonSet pods come back anyway, mirror pods belong to the kubelet."""
    return not pod.mirror and "DaemonSet" not in pod.owner_kinds


async def cordon(client: DrainClient, name: str, reason: str) -> NodeInfo:
    """Mark unschedulable; the annotation tells sync.py that we did it, not someone else."""
    info = await client.get_node(name)
    if info.unschedulable and info.annotations.get(ANNOTATION_CORDON) == reason:
        return info
    return await client.patch_node(name, {"spec": {"unschedulable": True},
                                          "metadata": {"annotations": {ANNOTATION_CORDON: reason}}})


async def uncordon(client: DrainClient, name: str) -> NodeInfo:
    info = await client.get_node(name)
    if not info.unschedulable and ANNOTATION_CORDON not in info.annotations:
        return info
    return await client.patch_node(name, {"spec": {"unschedulable": None},
                                          "metadata": {"annotations": {ANNOTATION_CORDON: None}}})


class Drainer:
    def __init__(self, client: DrainClient, *, timeout_s: float, backoff_s: float,
                 poll_interval_s: float, now: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._backoff_s = backoff_s
        self._poll_s = poll_interval_s
        self._now = now
        self._sleep = sleep

    async def drain(self, name: str, reason: str) -> None:
        """Cordon ``name`` and evict its pods until none is left (DaemonSet/mirror aside)."""
        await cordon(self._client, name, reason)
        deadline = self._now() + self._timeout_s
        backoff = Backoff(self._backoff_s, _MAX_BACKOFF_S)  # doubling, jittered
        refusals = 0
        while True:
            pods = [p for p in await self._client.list_pods(name) if evictable(p)]
            if not pods:
                log.info("node %s: drained", name)
                return
            blocked = await self._evict([p for p in pods if not p.deleting])
            waiting = [f"{p.namespace}/{p.name}" for p in pods if p.deleting]
            if self._now() >= deadline:
                raise DrainTimeout(name, self._timeout_s, blocked, waiting)
            if blocked:
                delay = backoff.delay_s(refusals)
                refusals += 1
                log.warning("node %s: eviction refused by PodDisruptionBudget %s; retry in %.0f s",
                            name, ", ".join(sorted(set(blocked.values()))), delay)
            else:
                delay = self._poll_s
            await self._sleep(min(delay, max(deadline - self._now(), 0.0)))

    async def _evict(self, pods: list[PodInfo]) -> dict[str, str]:
        """Evict each pod; return ``{"ns/pod": "ns/pdb"}`` for those a budget refused."""
        async def one(pod: PodInfo) -> tuple[str, str] | None:
            try:
                await self._client.evict_pod(pod.namespace, pod.name)
            except EvictionBlocked as exc:
                return f"{pod.namespace}/{pod.name}", f"{pod.namespace}/{exc.pdb}"
            return None
        results = await asyncio.gather(*(one(p) for p in pods))
        return dict(r for r in results if r is not None)
