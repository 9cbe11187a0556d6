"""A DHCP worker process's "whose MAC is this?" (``boot/dhcp_worker.py``), on a real store:
answers are read once and kept, a change the daemon tells drops them (also one told while
the read was out, which must not be kept), ``None`` drops all; a node the daemon tells is
the answer with no read; malformed notices from the control socket are refused, not
obeyed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import pytest

from provisioner.boot.dhcp_worker import ANSWER_TTL_S, WorkerInventory, dispatch
from provisioner.boot.dhcp_workers import DhcpWorkers
from provisioner.boot.worker_group import Worker
from provisioner.domain import KnownNode, NewNode
from provisioner.lifecycle.states import NodeState
from provisioner.store.mac_lookup import MacLookup
from provisioner.store.store import Store
from tests.peers.dhcp_client import MemoryInventory

MAC = "52:54:00:99:00:01"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingLookup(MacLookup):
    reads = 0

    async def owner(self, mac: str) -> Any:
        self.reads += 1
        return await super().owner(mac)


@pytest.fixture
def parts(store: Store) -> tuple[WorkerInventory, CountingLookup, list[dict[str, Any]], Clock]:
    sent: list[dict[str, Any]] = []
    clock = Clock()
    macs = CountingLookup(store.engine, store.boot_pool)
    return WorkerInventory(macs, sent.append, clock=clock), macs, sent, clock


async def test_answers_are_kept_until_the_daemon_says_the_mac_changed(
        store: Store, parts: tuple[WorkerInventory, CountingLookup, list[dict[str, Any]],
                                   Clock]) -> None:
    inventory, macs, sent, clock = parts
    assert await inventory.lookup(MAC) is None
    assert await inventory.lookup(MAC) is None and macs.reads == 1  # kept
    node = await store.nodes.create(NewNode(state=NodeState.ACTIVE, hostname="gpu-1",
                                            macs=(MAC,)), actor="test")
    assert await inventory.lookup(MAC) is None  # not told yet: the kept answer
    dispatch(inventory, {"forget": [MAC]})
    known = await inventory.lookup(MAC)
    assert known is not None and (known.node_id, known.hostname) == (node.id, "gpu-1")
    assert macs.reads == 2
    dispatch(inventory, {"forget": None})  # anything may have changed
    assert await inventory.lookup(MAC) == known and macs.reads == 3
    clock.now += ANSWER_TTL_S + 1  # other daemons' writes: the answer lapses
    assert await inventory.lookup(MAC) == known and macs.reads == 4
    await inventory.unknown_mac_booted("52:54:00:99:00:02", "uefi_x64")
    assert sent == [{"unknown": ["52:54:00:99:00:02", "uefi_x64"]}]


async def test_a_change_told_while_the_read_is_out_is_not_lost(
        store: Store, parts: tuple[WorkerInventory, CountingLookup, list[dict[str, Any]],
                                   Clock]) -> None:
    inventory, macs, _sent, _clock = parts
    reading = asyncio.create_task(inventory.lookup(MAC))
    await asyncio.sleep(0)  # the read is out
    dispatch(inventory, {"forget": [MAC]})  # the node was enrolled meanwhile
    assert await reading is None  # what the read saw ...
    await store.nodes.create(NewNode(state=NodeState.ACTIVE, hostname="gpu-2",
                                     macs=(MAC,)), actor="test")
    known = await inventory.lookup(MAC)  # ... was not kept
    assert known is not None and known.hostname == "gpu-2" and macs.reads == 2


class OneWorker(DhcpWorkers):
    """The daemon's side with one worker at the end of a socket pair (no process)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__([], init={}, inventory=MemoryInventory())
        self._one = worker

    def running(self) -> list[Worker]:
        return [self._one]


async def test_a_node_the_daemon_tells_is_the_answer_with_no_read(
        parts: tuple[WorkerInventory, CountingLookup, list[dict[str, Any]], Clock]) -> None:
    """What the conductor wrote reaches the worker as ``known`` (the daemon's side builds
    the messages: ``DhcpWorkers.changed``); a MAC told with no node is read again."""
    inventory, macs, _sent, _clock = parts
    other = "52:54:00:99:00:03"
    assert await inventory.lookup(MAC) is None and await inventory.lookup(other) is None
    reading = asyncio.create_task(inventory.lookup("52:54:00:99:00:04"))
    await asyncio.sleep(0)  # a read out while the daemon tells that MAC's node
    daemon_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with daemon_end, worker_end:
        workers = OneWorker(Worker(0, None, daemon_end))  # type: ignore[arg-type]
        workers.changed({MAC: KnownNode("n-1", "gpu-1", "inspecting"), other: None,
                         "52:54:00:99:00:04": KnownNode("n-4", None, "discovered")})
        workers.changed({MAC: KnownNode("n-1", "gpu-1", "inspected")})  # the latest wins
        await asyncio.sleep(0.05)  # told once this turn of the loop is over
        worker_end.setblocking(False)
        told = []
        with contextlib.suppress(BlockingIOError):
            while data := worker_end.recv(1 << 16):
                told.append(json.loads(data))
    assert told == [{"forget": [other]},
                    {"known": [["52:54:00:99:00:01", "n-1", "gpu-1", "inspected"],
                               ["52:54:00:99:00:04", "n-4", None, "discovered"]]}]
    for message in told:
        dispatch(inventory, message)
    reads = macs.reads
    assert await inventory.lookup(MAC) == KnownNode("n-1", "gpu-1", "inspected")
    assert macs.reads == reads  # no read
    assert await reading is None  # what the read saw is its caller's, and not kept:
    assert await inventory.lookup("52:54:00:99:00:04") == KnownNode("n-4", None,
                                                                    "discovered")
    assert await inventory.lookup(other) is None and macs.reads == reads + 1  # read again


@pytest.mark.parametrize("message", [{"forget": "52:54:00:99:00:01"}, {"forget": 7},
                                     {"forget": [1, 2]}, {"known": {"a": 1}},
                                     {"known": [["52:54:00:99:00:01", "n-1", None]]},
                                     {"known": [["52:54:00:99:00:01", "n-1", 5, "active"]]}])
def test_malformed_notices_are_refused(
        message: dict[str, Any], parts: tuple[WorkerInventory, CountingLookup,
                                              list[dict[str, Any]], Clock]) -> None:
    with pytest.raises((TypeError, ValueError)):
        dispatch(parts[0], message)
