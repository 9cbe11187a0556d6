"""The existing-OS hold (issue 30, item 2): the ramdisk's collector reads the first sectors of
each disk (partition tables and file systems made by the real sfdisk and mkfs.ext4), and an
inspection that finds data holds the node in ``inspected`` before any deploy, until its
profile (``[lifecycle] allow_overwrite``) or an operator (``allow-overwrite``) allows it, or
it is registered as the running machine it is (``register-running``)."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioner.agent.collect import collect, disk_signature
from provisioner.config import LifecycleSettings
from provisioner.domain import NewNode
from provisioner.errors import Conflict
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.validation.existing_os import OVERRIDE_EVENT
from tests.conftest import fake_ports, wait_for_state
from tests.integration.test_api import NODES, running_api
from tests.integration.test_sku_gate import CollectorInspector
from tests.unit.test_gpu_ids import sysfs_tree

S = NodeState
pytestmark = pytest.mark.skipif(shutil.which("sfdisk") is None or
                                shutil.which("mkfs.ext4") is None,
                                reason="util-linux sfdisk and e2fsprogs mkfs.ext4 needed")


def _image(path: Path, how: str) -> Path:
    """A 64 MiB disk image: blank, or written by the real tools."""
    subprocess.run(["truncate", "-s", "64M", str(path)], check=True)
    if how in ("gpt", "dos"):
        subprocess.run(["sfdisk", "-q", str(path)], input=f"label: {how}\n,32M\n,\n",
                       text=True, check=True, capture_output=True)
    elif how == "ext4":
        subprocess.run(["mkfs.ext4", "-q", "-F", str(path)], check=True, capture_output=True)
    return path


@pytest.mark.parametrize(("how", "signature"), [
    ("gpt", "gpt"), ("dos", "mbr"), ("ext4", "ext"), ("blank", "")])
def test_disk_signature_of_real_images(tmp_path: Path, how: str, signature: str) -> None:
    assert disk_signature(_image(tmp_path / "disk.img", how)) == signature


def test_an_unreadable_disk_has_no_signature(tmp_path: Path) -> None:
    assert disk_signature(tmp_path / "missing") == ""


def _node_with_disk(root: Path, how: str) -> Path:
    """A sysfs tree with one disk ``vda`` (and its partitions, as the kernel lists them
    under /sys/block/vda) whose /dev node is an image made by the real tools."""
    sysfs_tree(root, {})
    block = root / "sys/block/vda"
    (block / "queue").mkdir(parents=True)
    (block / "size").write_text("131072\n")
    (block / "queue/rotational").write_text("0\n")
    if how in ("gpt", "dos"):
        for number in (1, 2):
            (block / f"vda{number}").mkdir()
            (block / f"vda{number}/partition").write_text(f"{number}\n")
    (root / "dev").mkdir()
    _image(root / "dev/vda", how)
    return root


def test_the_collector_reports_partitions_and_signature(tmp_path: Path) -> None:
    disks = collect(_node_with_disk(tmp_path, "gpt"))["disks"]
    assert [(d["name"], d["partitions"], d["signature"]) for d in disks] == [("vda", 2, "gpt")]


def _conductor(store: Store, world: SimWorld, root: Path,
               allow_overwrite: tuple[str, ...] = ()) -> Conductor:
    lifecycle = LifecycleSettings(auto_inspect=True, auto_deploy=True,
                                  allow_overwrite=list(allow_overwrite))
    ports = dataclasses.replace(fake_ports(world), inspector=CollectorInspector(root))
    return Conductor(store.nodes, ports, lifecycle)


async def _enroll(cond: Conductor, serial: str, profile: str = "gpu-worker") -> str:
    node = await cond.enroll(NewNode(state=S.ENROLLED, serial=serial, hostname=serial.lower(),
                                     profile=profile), actor="test")
    return node.id


async def test_a_node_with_an_os_is_held_until_an_operator_allows_overwriting(
        tmp_path: Path, store: Store, world: SimWorld) -> None:
    cond = _conductor(store, world, _node_with_disk(tmp_path, "gpt"))
    node_id = await _enroll(cond, "OS-1")
    await wait_for_state(store, node_id, S.INSPECTED)
    await asyncio.sleep(0.3)  # the deploy policy had its chance
    assert (await store.nodes.get(node_id)).state is S.INSPECTED
    with pytest.raises(Conflict, match="existing OS or data was found .disk vda: gpt "
                                       "signature, 2 partitions"):
        await cond.fire(node_id, Event.DEPLOY, actor="op")
    await cond.allow_overwrite(node_id, actor="op", reason="reinstall, data backed up")
    await wait_for_state(store, node_id, S.ACTIVE)
    events = [h.event for h in await store.nodes.history(node_id)]
    assert events.index(OVERRIDE_EVENT) < events.index("deploy")
    await cond.stop()


async def test_a_blank_disk_or_an_allowing_profile_deploys_at_once(
        tmp_path: Path, store: Store, world: SimWorld) -> None:
    blank = _conductor(store, world, _node_with_disk(tmp_path / "blank", "blank"))
    deployed = await wait_for_state(store, await _enroll(blank, "BLANK-1"), S.ACTIVE)
    await blank.stop()
    allowing = _conductor(store, world, _node_with_disk(tmp_path / "os", "dos"),
                          allow_overwrite=("scratch",))
    overwritten = await wait_for_state(store, await _enroll(allowing, "SCRATCH-1", "scratch"),
                                       S.ACTIVE)
    await allowing.stop()
    assert deployed.state == overwritten.state == S.ACTIVE


async def test_the_api_offers_allow_overwrite_and_register_running(
        aiohttp_client: Any, tmp_path: Path, store: Store, world: SimWorld) -> None:
    root = _node_with_disk(tmp_path, "ext4")
    ports = dataclasses.replace(fake_ports(world), inspector=CollectorInspector(root))
    async with running_api(aiohttp_client, store, world, ports=ports) as api:
        node = await api.enroll(serial="OS-API", hostname="os-api", profile="gpu-worker")
        assert (await api.post(f"{NODES}/os-api/actions/inspect")).status == 202
        await wait_for_state(store, node["id"], S.INSPECTED)
        shown = (await api.get(f"{NODES}/os-api")).body
        assert "allow-overwrite" in shown["allowed_actions"]
        assert "deploy" not in shown["allowed_actions"]
        refused = await api.post(f"{NODES}/os-api/actions/deploy")
        assert refused.status == 409 and "register-running" in refused.body["detail"]
        no_reason = await api.post(f"{NODES}/os-api/actions/allow-overwrite")
        assert no_reason.status == 422
        kept = await api.post(f"{NODES}/os-api/actions/register-running",
                              {"reason": "runs the site's own image"})
        assert kept.status == 202 and kept.body["state"] == "active"
