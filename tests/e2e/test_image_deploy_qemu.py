"""Image deploy end to end (issue 5's proof): a qemu VM with a virtual disk, whose BMC is
OpenIPMI's ``ipmi_sim`` (its chassis starts and stops the VM), is inspected, then deployed
with a small bootable raw image this test builds (``disk_image.py``: MBR + syslinux + the
Debian kernel + a busybox initramfs whose init reads the cloud-init seed and calls back).

First the served image is corrupted (one flipped byte, so its sha256 no longer matches the
profile's): the step fails with the reason, the disk's boot area is zeroed and nothing calls
back. Then, with the image intact, the retried deploy writes it, the daemon sets the next
boot to disk and power-cycles the VM over IPMI; the VM boots the disk (its NIC has no PXE ROM
then: no netboot is possible) and its init posts ``booted`` with the hostname the daemon put
in the seed. TCG on a busy 2-core machine is slow: the timeouts are generous.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from tests.e2e.disk_image import build_disk_image, missing_tool
from tests.e2e.test_bmc_pxe_qemu import cli, enroll_vm, vm_and_daemon
from tests.e2e.test_pxe_qemu import Vm, _missing, build_ramdisk
from tests.peers.ipmi_sim import ipmi_sim_unavailable_reason
from tests.peers.netns import Namespace, bridged_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.root]
VM = Vm("disk", "52:54:00:77:00:30", "TEST-0300", 1, 768, uefi=False)
HOSTNAME = "vm-disk"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA ops@mgmt"
DISK_MIB = 96


def _config(state: Path, sha256: str) -> str:
    return (
        f'state_dir = "{state}"\n[api]\nlisten = "127.0.0.1:8700"\n'
        "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n"
        '[dhcp]\nmode = "authoritative"\ninterface = "br0"\n'
        'server_address = "10.77.0.1"\npool = "10.77.0.100-10.77.0.199"\n'
        '[http]\nlisten = "10.77.0.1:8080"\n[bmc]\ntimeout_s = 10\n'
        f'[deploy]\nssh_authorized_keys = ["{KEY}"]\ncallback_timeout_s = 900\n'
        f'[images.e2e]\nurl = "images/disk.raw"\nsha256 = "{sha256}"\nroot_disk = "smallest"\n')


def test_deploy_boots_the_disk_and_calls_back(tmp_path: Path) -> None:
    reason = _missing() or ipmi_sim_unavailable_reason() or missing_tool()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "state"
    build_ramdisk(state / "artefacts")
    image = build_disk_image()
    served = state / "artefacts" / "images" / "disk.raw"
    served.parent.mkdir(parents=True)
    good = image.read_bytes()
    served.write_bytes(good[:5 << 20] + bytes([good[5 << 20] ^ 0xFF]) + good[(5 << 20) + 1:])
    disk = tmp_path / "vm-disk.raw"
    disk.write_bytes(b"")
    os.truncate(disk, DISK_MIB << 20)
    bmc_dir = tmp_path / "bmc"
    with bridged_namespace() as ns:
        tap = ns.add_tap()
        config = tmp_path / "provisioner.toml"
        config.write_text(_config(state, hashlib.sha256(good).hexdigest()))
        with vm_and_daemon(ns, tap, config, tmp_path, VM, [
                "-drive", f"file={disk},format=raw,if=virtio,cache=unsafe"]) as env:
            enroll_vm(ns, config, env, tmp_path, HOSTNAME, "--profile", "e2e", vm=VM)
            cli(ns, config, "node", "action", HOSTNAME, "inspect", env=env)
            _wait_state(ns, config, env, tmp_path, {"inspected"}, 300)
            cli(ns, config, "node", "action", HOSTNAME, "deploy", env=env)
            failed = _wait_state(ns, config, env, tmp_path, {"deploy_failed"}, 400)
            boot_area = disk.read_bytes()[:1 << 20]
            served.write_bytes(good)  # the intact image: the retry writes it
            deploys_before = _served_deploy_scripts(tmp_path)
            cli(ns, config, "node", "action", HOSTNAME, "retry", env=env)
            _wait_booted(tmp_path, 600)
            after_reboot = _served_deploy_scripts(tmp_path)
    history = _history(state / "provisioner.sqlite")
    events = [event for event, _ in history]
    first_fail = events.index("fail")
    assert "sha256 mismatch" in failed["last_error"] and "boot area was wiped" in \
        failed["last_error"], failed
    assert boot_area == bytes(1 << 20)  # no partition table, no boot code: never boots
    assert "booted" not in events[:first_fail] and "image_written" not in events[:first_fail]
    written = [reason for event, reason in history if event == "image_written"]
    assert len(written) == 1 and f"sha256 {hashlib.sha256(good).hexdigest()} verified" in \
        written[0] and "seed partition 2" in written[0], history
    booted = [reason for event, reason in history if event == "booted"]
    prefix = f"hostname '{HOSTNAME}' from "
    assert len(booted) == 1 and booted[0].startswith(prefix), (history, _logs(tmp_path))
    address = booted[0].removeprefix(prefix)  # the disk OS's own DHCP lease, from our pool
    assert ipaddress.IPv4Address("10.77.0.100") <= ipaddress.IPv4Address(address) <= \
        ipaddress.IPv4Address("10.77.0.199"), booted
    assert _facts(state / "provisioner.sqlite")["address"] == address  # Ansible's target
    assert events.index("image_written") < events.index("booted")
    # no netboot after the reboot: one deploy script per deploy attempt, the disk booted
    assert deploys_before == 1 and after_reboot == 2, _logs(tmp_path)
    serial = (bmc_dir / "serial.log").read_text(errors="replace")
    assert "disk-os: booted from disk" in serial and f"hostname {HOSTNAME}" in serial
    sets = [c for c in (bmc_dir / "chassis.log").read_text().splitlines() if c.startswith("set")]
    last_on = len(sets) - 1 - sets[::-1].index("set power 1")
    boot_sets = [c for c in sets[:last_on] if c.startswith("set boot")]
    assert boot_sets[-1] != "set boot pxe", sets  # the disk boot was set before power-on


def _wait_state(ns: Namespace, config: Path, env: dict[str, str], tmp_path: Path,
                wanted: set[str], timeout_s: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    shown: dict[str, object] = {}
    while time.monotonic() < deadline:
        shown = json.loads(cli(ns, config, "node", "show", HOSTNAME, "--json", env=env))
        if shown["state"] in wanted or str(shown["state"]).endswith("_failed"):
            break
        time.sleep(3)
    assert shown.get("state") in wanted, (shown, _logs(tmp_path))
    return shown


def _wait_booted(tmp_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    db = tmp_path / "state" / "provisioner.sqlite"
    while time.monotonic() < deadline:
        events = [event for event, _ in _history(db)]
        if "booted" in events or events.count("fail") > 1:
            return
        time.sleep(3)
    pytest.fail("no booted callback in time: " + _logs(tmp_path))


def _history(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return [(event, reason or "") for event, reason in conn.execute(
            "SELECT event, reason FROM transition ORDER BY id")]


def _facts(db: Path) -> dict[str, object]:
    with sqlite3.connect(db) as conn:
        (facts,) = conn.execute("SELECT facts FROM node").fetchone()
    loaded: dict[str, object] = json.loads(facts)
    return loaded


def _served_deploy_scripts(tmp_path: Path) -> int:
    return (tmp_path / "daemon.log").read_text(errors="replace").count(
        f"served deploy script to {VM.mac}")


def _logs(tmp_path: Path) -> str:
    parts = []
    for path in (tmp_path / "daemon.log", tmp_path / "bmc" / "serial.log",
                 tmp_path / "bmc" / "chassis.log"):
        if path.exists():
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-4000:]}")
    return "\n".join(parts)

