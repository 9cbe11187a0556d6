"""``bootdev http`` through the conductor: a Redfish BMC (tests/sim/redfish.py) is told
``UefiHttp`` with the node's ``HttpBootUri``, the boot HTTP server's first stage for the
node's architecture, and the history row says which URI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from provisioner.bmc.base import BootDevice
from provisioner.bmc.managed import BmcManager
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.registry import BmcRegistry
from provisioner.boot.stack import http_boot_uris
from provisioner.config import BmcSettings, HttpSettings, LifecycleSettings, Settings
from provisioner.domain import BmcEndpoint, NewNode
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.sim.redfish import RedfishSim, make_app

PUBLIC = "http://10.77.0.1:8080"


@pytest.mark.parametrize(("arch", "uri"), [
    ("aarch64", f"{PUBLIC}/ipxe/grubaa64.efi"), ("x86_64", f"{PUBLIC}/ipxe/snponly.efi"),
    (None, None)], ids=["arm64", "x86_64", "not-inspected"])
async def test_bootdev_http_sets_the_node_http_boot_uri(
        aiohttp_server: Any, store: Store, world: SimWorld, tmp_path: Path,
        arch: str | None, uri: str | None) -> None:
    sim = RedfishSim(user="admin", password="pw")
    server = await aiohttp_server(make_app(sim))
    settings = Settings(state_dir=tmp_path / "s", http=HttpSettings(
        listen="127.0.0.1:8080", public_url=PUBLIC))
    driver = RedfishDriver(timeout_s=5)
    manager = BmcManager(BmcRegistry({"redfish": driver}), BmcSettings(timeout_s=5))
    ports = replace(fake_ports(world), bmc=manager, http_boot_uri=http_boot_uris(settings))
    conductor = Conductor(store.nodes, ports, LifecycleSettings(auto_inspect=False))
    node = await store.nodes.create(NewNode(
        state=NodeState.ENROLLED, serial="H1", bmc_password="pw",
        bmc=BmcEndpoint("redfish", f"http://127.0.0.1:{server.port}", username="admin",
                        password_set=True)), actor="test")
    if arch is not None:
        await store.nodes.merge_facts(node.id, {"cpu": {"arch": arch, "cores": 72}})
    await conductor.set_boot_device(node.id, BootDevice.HTTP, persistent=False, uefi=True,
                                    actor="operator")
    want: dict[str, object] = {"BootSourceOverrideTarget": "UefiHttp",
                               "BootSourceOverrideEnabled": "Once",
                               "BootSourceOverrideMode": "UEFI"}
    if uri is not None:
        want["HttpBootUri"] = uri
    assert sim.patches == [want]
    last = (await store.nodes.history(node.id))[-1]
    assert last.event == "bootdev"
    assert last.reason == "boot device http (once, UEFI" + (f", from {uri})" if uri else ")")
    await conductor.stop()
    await driver.aclose()
