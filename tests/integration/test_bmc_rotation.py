"""BMC password rotation (``lifecycle/rotation.py``) against OpenIPMI's ipmi_sim (IPMI Set
User Password) and tests/sim/redfish.py (AccountService; sushy-tools 2.2.0 has none): the
old password stops working, the new one works (checked with ipmitool, a client of its own),
neither appears in the history; and a rotation SIGKILLed at a random point, 10 times, never
leaves a node whose BMC we cannot log in to."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from provisioner.api.app import make_app as make_api
from provisioner.bmc.base import BmcAuthFailed
from provisioner.bmc.ipmi import IpmiDriver
from provisioner.bmc.ipmi_pool import IpmiWorkers
from provisioner.bmc.managed import BmcManager
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.registry import BmcRegistry
from provisioner.config import ApiSettings, BmcSettings, LifecycleSettings, Settings
from provisioner.domain import BmcCredentials, BmcEndpoint, NewNode, Node, Role
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.rotation import ABANDONED, RECOVERED, ROTATED, BmcRotation
from provisioner.lifecycle.states import NodeState
from provisioner.metrics import Metrics
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store, open_store
from tests.conftest import fake_ports
from tests.peers.ipmi_sim import (
    PASSWORD,
    USER,
    IpmiSimBmc,
    ipmi_sim_unavailable_reason,
    running_ipmi_sim,
)
from tests.sim.redfish import RedfishSim, make_app

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = BmcSettings(timeout_s=3, retries=1, retry_backoff_s=0.1)


@pytest.fixture
def ipmi_sim(tmp_path: Path) -> Iterator[IpmiSimBmc]:
    reason = ipmi_sim_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with running_ipmi_sim(tmp_path / "ipmi_sim") as bmc:
        yield bmc


def ipmitool_logs_in(port: int, password: str) -> bool:
    done = subprocess.run(["ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p",
                           str(port), "-U", USER, "-P", password, "chassis", "power",
                           "status"], capture_output=True, text=True, timeout=30)
    return done.returncode == 0


def ipmi_rotation(store: Store) -> tuple[BmcRotation, IpmiDriver]:
    driver = IpmiDriver(IpmiWorkers(count=1, threads=4), timeout_s=SETTINGS.timeout_s)
    manager = BmcManager(BmcRegistry({"ipmi": driver}), SETTINGS)
    return BmcRotation(store.nodes, store.bmc_secrets, manager,
                       effective=manager.credentials_for), driver


async def enroll_ipmi(store: Store, port: int, password: str = PASSWORD) -> Node:
    return await store.nodes.create(NewNode(
        state=NodeState.ENROLLED, serial=f"R{port}", bmc_password=password,
        bmc=BmcEndpoint("ipmi", "127.0.0.1", port, username=USER, password_set=True)),
        actor="test")


def no_secret_in_history(history: list[Any], *secrets: str) -> None:
    text = json.dumps([(h.event, h.reason, h.actor) for h in history])
    assert not [s for s in secrets if s and s in text], "a password in the history"


async def test_ipmi_rotation_old_stops_new_works(ipmi_sim: IpmiSimBmc, store: Store) -> None:
    node = await enroll_ipmi(store, ipmi_sim.port)
    rotation, driver = ipmi_rotation(store)
    await rotation.rotate(node, actor="token:operator")
    new = (await store.nodes.credentials(node.id)).password
    assert new is not None and new != PASSWORD and len(new) == 16
    assert await store.bmc_secrets.pending(node.id) is None
    assert not await asyncio.to_thread(ipmitool_logs_in, ipmi_sim.port, PASSWORD)
    assert await asyncio.to_thread(ipmitool_logs_in, ipmi_sim.port, new)
    history = await store.nodes.history(node.id)
    assert history[-1].event == ROTATED and history[-1].actor == "token:operator"
    no_secret_in_history(history, PASSWORD, new)
    await rotation.rotate(await store.nodes.get(node.id), actor="op")  # again, from the new
    newer = (await store.nodes.credentials(node.id)).password
    assert newer not in (None, new)
    assert await asyncio.to_thread(ipmitool_logs_in, ipmi_sim.port, newer or "")
    await driver.aclose()


async def test_redfish_rotation_through_account_service(aiohttp_server: Any,
                                                        store: Store) -> None:
    sim = RedfishSim(user="admin", password="factory-pw")
    server = await aiohttp_server(make_app(sim))
    driver = RedfishDriver(timeout_s=5)
    manager = BmcManager(BmcRegistry({"redfish": driver}), SETTINGS)
    rotation = BmcRotation(store.nodes, store.bmc_secrets, manager)
    node = await store.nodes.create(NewNode(
        state=NodeState.ENROLLED, serial="RF1", bmc_password="factory-pw",
        bmc=BmcEndpoint("redfish", f"http://127.0.0.1:{server.port}", username="admin",
                        password_set=True)), actor="test")
    await rotation.rotate(node, actor="op")
    new = (await store.nodes.credentials(node.id)).password
    assert new is not None and sim.password == new and sim.password_changes == 1
    old_login = manager(node.id, node.bmc or BmcEndpoint("redfish", ""),
                        BmcCredentials("admin", "factory-pw"))
    with pytest.raises(BmcAuthFailed):
        await old_login.verify_login()
    no_secret_in_history(await store.nodes.history(node.id), "factory-pw", new)
    await driver.aclose()


async def test_api_rotate_returns_no_secret_and_needs_an_admin(
        aiohttp_client: Any, aiohttp_server: Any, store: Store, world: SimWorld) -> None:
    """``POST /nodes/{id}/bmc/rotate`` (what ``provisioner node bmc NODE rotate`` sends)."""
    sim = RedfishSim(user="admin", password="factory-pw")
    server = await aiohttp_server(make_app(sim))
    driver = RedfishDriver(timeout_s=5)
    manager = BmcManager(BmcRegistry({"redfish": driver}), SETTINGS)
    rotation = BmcRotation(store.nodes, store.bmc_secrets, manager)
    conductor = Conductor(store.nodes, replace(fake_ports(world), bmc=manager),
                          LifecycleSettings(auto_inspect=False))
    app = make_api(conductor=conductor, nodes=store.nodes, tokens=store.tokens,
                   metrics=Metrics(), settings=ApiSettings(), rotation=rotation)
    client = await aiohttp_client(app)
    tokens = {role: (await store.tokens.create(f"{role}-t", role))[1]
              for role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN)}
    node = await store.nodes.create(NewNode(
        state=NodeState.ENROLLED, serial="RF3", bmc_password="factory-pw",
        bmc=BmcEndpoint("redfish", f"http://127.0.0.1:{server.port}", username="admin",
                        password_set=True)), actor="test")
    path = f"/api/v1/nodes/{node.id}/bmc/rotate"
    for role in (Role.VIEWER, Role.OPERATOR):  # a credential change: admin only
        denied = await client.post(path, headers={"Authorization": f"Bearer {tokens[role]}"})
        assert denied.status == 403, role
    assert sim.password_changes == 0
    reply = await client.post(path, headers={"Authorization":
                                             f"Bearer {tokens[Role.ADMIN]}"})
    text = await reply.text()
    assert reply.status == 200, text
    assert sim.password_changes == 1 and sim.password not in text and "factory-pw" not in text
    history = await client.get(f"/api/v1/nodes/{node.id}/history", headers={
        "Authorization": f"Bearer {tokens[Role.VIEWER]}"})
    history_text = await history.text()
    assert "bmc_password_rotated" in history_text and sim.password not in history_text
    await conductor.stop()
    await driver.aclose()


@pytest.mark.parametrize("opted_in", [True, False], ids=["profile-opts-in", "default"])
async def test_inspection_rotates_when_the_profile_opts_in(
        aiohttp_server: Any, store: Store, world: SimWorld, opted_in: bool) -> None:
    """The daemon's hook (``rotate_if_opted_in``) as inspection's last sub-step."""
    from provisioner.config import BmcProfile
    from provisioner.daemon import rotate_if_opted_in
    from provisioner.lifecycle.states import Event

    sim = RedfishSim(user="admin", password="factory-pw")
    server = await aiohttp_server(make_app(sim))
    settings = SETTINGS.model_copy(update={
        "confirm_poll_s": 0.05, "profiles": {"gpu": BmcProfile(rotate_credentials=opted_in)}})
    driver = RedfishDriver(timeout_s=5)
    manager = BmcManager(BmcRegistry({"redfish": driver}), settings)
    rotation = BmcRotation(store.nodes, store.bmc_secrets, manager)
    ports = replace(fake_ports(world), bmc=manager,
                    rotate_bmc=rotate_if_opted_in(settings, rotation))
    conductor = Conductor(store.nodes, ports, LifecycleSettings(auto_inspect=False,
                                                                auto_deploy=False))
    node = await store.nodes.create(NewNode(
        state=NodeState.ENROLLED, serial="RF4", profile="gpu", bmc_password="factory-pw",
        bmc=BmcEndpoint("redfish", f"http://127.0.0.1:{server.port}", username="admin",
                        password_set=True)), actor="test")
    await conductor.fire(node.id, Event.INSPECT, actor="test")
    for _ in range(200):
        if (await store.nodes.get(node.id)).state in (NodeState.INSPECTED,
                                                      NodeState.INSPECT_FAILED):
            break
        await asyncio.sleep(0.05)
    done = await store.nodes.get(node.id)
    assert done.state is NodeState.INSPECTED, done.last_error
    assert sim.password_changes == (1 if opted_in else 0)
    stored = (await store.nodes.credentials(node.id)).password
    assert (stored == sim.password) and (stored != "factory-pw") is opted_in
    await conductor.stop()
    await driver.aclose()


async def test_a_refused_change_keeps_the_old_password(aiohttp_server: Any,
                                                       store: Store) -> None:
    """A BMC that refuses the new password (this one: shorter than 8 characters) changes
    nothing: the rotation is settled as abandoned, the old password kept and working."""
    sim = RedfishSim(user="admin", password="factory-pw")
    server = await aiohttp_server(make_app(sim))
    driver = RedfishDriver(timeout_s=5)
    manager = BmcManager(BmcRegistry({"redfish": driver}), SETTINGS)
    rotation = BmcRotation(store.nodes, store.bmc_secrets, manager,
                           passwords=lambda _n: "short")
    node = await store.nodes.create(NewNode(
        state=NodeState.ENROLLED, serial="RF2", bmc_password="factory-pw",
        bmc=BmcEndpoint("redfish", f"http://127.0.0.1:{server.port}", username="admin",
                        password_set=True)), actor="test")
    with pytest.raises(Exception, match="password too short"):
        await rotation.rotate(node, actor="op")
    assert (await store.nodes.credentials(node.id)).password == "factory-pw"
    assert await store.bmc_secrets.pending(node.id) is None
    assert (await store.nodes.history(node.id))[-1].event == ABANDONED
    assert sim.password == "factory-pw" and sim.password_changes == 0
    await driver.aclose()


async def test_sigkill_at_a_random_point_never_locks_us_out(ipmi_sim: IpmiSimBmc) -> None:
    """10 rotations in a child process, each SIGKILLed a random 0-2 s after it began
    (before, during or after the change; some finish); then the daemon's start-up settle
    runs, and the stored password must log in (ipmitool)."""
    state = Path(tempfile.mkdtemp(prefix="rotation-"))
    settings = Settings(state_dir=state)
    store = open_store(settings, migrate=True)
    node = await enroll_ipmi(store, ipmi_sim.port)
    store.close()
    rng = random.Random(15)
    outcomes = []
    for _ in range(10):
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.integration.test_bmc_rotation", str(state), node.id,
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert child.stdout is not None
        assert await child.stdout.readline() == b"rotating\n"  # imports and store done
        delay_s = rng.uniform(0.0, 2.0)  # a rotation takes about 0.5-1.5 s here (loaded)
        try:
            await asyncio.wait_for(child.wait(), delay_s)
            killed = False
        except TimeoutError:
            child.kill()
            await child.wait()
            killed = True
        store = open_store(settings, migrate=False)
        rotation, driver = ipmi_rotation(store)
        try:
            settled = await rotation.settle(await store.nodes.get(node.id), actor="startup")
            password = (await store.nodes.credentials(node.id)).password or ""
            assert await store.bmc_secrets.pending(node.id) is None
            assert await asyncio.to_thread(ipmitool_logs_in, ipmi_sim.port, password), (
                delay_s, killed, settled)
        finally:
            await driver.aclose()
            store.close()
        outcomes.append(("killed" if killed else "finished", settled))
    print("rotation kill outcomes:", outcomes)
    assert any(kind == "killed" for kind, _ in outcomes)
    events = {RECOVERED, ABANDONED, ROTATED}
    store = open_store(settings, migrate=False)
    history = [h.event for h in await store.nodes.history(node.id) if h.event in events]
    store.close()
    assert history, "some rotations landed or were settled"


async def _child(state: Path, node_id: str) -> None:
    store = open_store(Settings(state_dir=state), migrate=False)
    rotation, driver = ipmi_rotation(store)
    node = await store.nodes.get(node_id)
    print("rotating", flush=True)
    await rotation.rotate(node, actor="child")
    await driver.aclose()
    store.close()


if __name__ == "__main__":
    asyncio.run(_child(Path(sys.argv[1]), sys.argv[2]))


async def test_old_password_readers_do_not_stall_the_new_one(ipmi_sim: IpmiSimBmc,
                                                             store: Store) -> None:
    """After a rotation, readers that still hold the old password (the power sync read it
    before the promote) call the BMC at the same time as the new one, through the one
    worker process that owns the BMC: pyghmi routes a BMC's datagrams by address, so two
    logins of one process with two passwords stalled each other until the deadline (the
    CI failure of test_bmc_rotate_from_the_cli). Now the worker keeps one session per BMC:
    every new-password call answers, every old-password call fails as a refused login."""
    rotation, driver = ipmi_rotation(store)
    node = await enroll_ipmi(store, ipmi_sim.port)
    await rotation.rotate(node, actor="op")
    new = (await store.nodes.credentials(node.id)).password or ""
    endpoint = BmcEndpoint("ipmi", "127.0.0.1", ipmi_sim.port)

    async def power(password: str) -> str:
        bmc = driver(node.id, endpoint, BmcCredentials(USER, password))
        try:
            return str(await bmc.power_state())
        except BmcAuthFailed:
            return "refused"
        except Exception as exc:  # a stall: the deadline's BmcTimeout, or anything else
            return f"{type(exc).__name__}: {exc}"

    for _ in range(4):
        answers = await asyncio.gather(power(PASSWORD), power(new), power(PASSWORD),
                                       power(new))
        assert answers[1] == answers[3] == "off", answers
        assert answers[0] == answers[2] == "refused", answers
    await driver.aclose()
