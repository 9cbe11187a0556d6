"""The deploy step's wait for the deployed OS's callback (``lifecycle/callbacks.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from provisioner.domain import BmcEndpoint, Node
from provisioner.errors import FatalError, InvalidRequest
from provisioner.ids import NodeId
from provisioner.lifecycle.callbacks import BootCallbacks, Callback
from provisioner.lifecycle.states import NodeState


def node(**changes: Any) -> Node:
    now = datetime.now(UTC)
    base = Node(id=NodeId("n-1"), state=NodeState.DEPLOYING, hostname="gpu-1.r1.example",
                serial="S1", macs=("52:54:00:00:00:01",), maintenance=False,
                maintenance_reason="", profile="img", rack=None, position=None, facts={},
                last_error="", checkpoint=(), version=1, history_seq=1, bmc=None,
                created_at=now, updated_at=now)
    return replace(base, **changes)


async def test_booted_or_installed_ends_the_wait() -> None:
    for event in ("booted", "installed"):
        callbacks = BootCallbacks(timeout_s=5)
        waiting = asyncio.create_task(callbacks.wait_booted(node()))
        await asyncio.sleep(0)
        assert callbacks.deliver("n-1", Callback(event, "gpu-1")) is True  # short name ok
        await waiting


async def test_a_callback_before_the_wait_is_kept_and_forget_drops_it() -> None:
    callbacks = BootCallbacks(timeout_s=0.05)
    assert callbacks.deliver("n-1", Callback("booted", "gpu-1.r1.example")) is False
    await callbacks.wait_booted(node())  # returns at once
    callbacks.deliver("n-1", Callback("booted", "gpu-1"))
    await callbacks.forget(node())  # the step reboots the node: an earlier boot's is stale
    with pytest.raises(FatalError, match="did not call back within 0.05 s"):
        await callbacks.wait_booted(node())


async def test_another_hostname_fails_with_the_reason() -> None:
    callbacks = BootCallbacks(timeout_s=5)
    callbacks.deliver("n-1", Callback("booted", "localhost"))
    with pytest.raises(FatalError, match="reported hostname 'localhost'.*seed was not"):
        await callbacks.wait_booted(node())


async def test_no_wait_for_simulated_nodes_or_a_zero_timeout() -> None:
    fake = BmcEndpoint(driver="fake", address="sim-1")
    simulated, off = BootCallbacks(timeout_s=5), BootCallbacks(timeout_s=0)
    assert not simulated.waits(node(bmc=fake)) and not off.waits(node())
    assert BootCallbacks(timeout_s=5).waits(node())  # a real node does wait
    async with asyncio.timeout(1):  # returns at once, no callback needed
        await simulated.wait_booted(node(bmc=fake))
        await off.wait_booted(node())


def test_installer_profiles_and_body_checks() -> None:
    callbacks = BootCallbacks(timeout_s=1, installer_profiles=frozenset({"ubuntu"}))
    assert callbacks.uses_installer(node(profile="ubuntu"))
    assert not callbacks.uses_installer(node()) and not callbacks.uses_installer(
        node(profile=None))
    assert Callback.parse({"event": "installed", "hostname": "h"}) == Callback("installed", "h")
    for body in ({"event": "up"}, {"event": "booted", "hostname": 1},
                 {"event": "booted", "hostname": "x" * 254}):
        with pytest.raises(InvalidRequest):
            Callback.parse(body)
