"""The event feed (``/api/v1/events``' source) reads the shared history only while a client
follows it: with nobody connected, a fleet onboarding on three daemons read the history once
per transition per daemon (4-5 reads a node, the first cost in the HA fleet's profile), and
the first client to connect still gets every transition committed after it connected."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from provisioner.api.events import EventFeed, EventHub
from provisioner.domain import NewNode, Node
from provisioner.lifecycle.states import NodeState
from provisioner.store.node_reads import NodeReads
from provisioner.store.store import Store

S = NodeState


def counted(monkeypatch: pytest.MonkeyPatch, reads: NodeReads) -> Counter[str]:
    """How often the feed reads the history (the real reads, counted)."""
    calls: Counter[str] = Counter()
    for name in ("events", "last_event_id"):
        real = getattr(reads, name)

        async def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return await _real(*args, **kwargs)

        monkeypatch.setattr(reads, name, spy)
    return calls


async def step(store: Store, node: Node, to: NodeState) -> Node:
    return await store.nodes.transition(node, to_state=to, event=str(to), actor="test")


async def test_a_feed_nobody_follows_reads_nothing_and_its_first_client_misses_nothing(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    node = await store.nodes.create(NewNode(state=S.ENROLLED, hostname="gpu-0001",
                                            serial="SN1", macs=("52:54:00:00:00:01",)),
                                    actor="test")
    calls = counted(monkeypatch, store.nodes)
    hub = EventHub()
    feed = EventFeed(store.nodes, hub)
    for to in (S.INSPECTING, S.INSPECTED):  # transitions wake the feed: no one listens
        node = await step(store, node, to)
        feed.poke(node, str(to), S.ENROLLED)
        await feed.read()
    assert calls == Counter()

    client = hub.subscribe()  # what a stream does first, then arm, then "connected"
    await feed.arm()
    assert calls == Counter(last_event_id=1)
    node = await step(store, node, S.DEPLOYING)
    await feed.read()
    frames = [frame for frame in client.queue]
    assert [f.node_id for f in frames] == [node.id]
    assert b'"state": "deploying"' in frames[0].data  # this one only, not the history before
    await feed.arm()  # a second client: the feed is armed already
    assert calls["last_event_id"] == 1

    hub.unsubscribe(client)
    before = calls.copy()
    node = await step(store, node, S.CONFIGURING)
    await feed.read()
    assert calls == before  # idle again
