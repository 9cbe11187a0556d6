"""A node onboards on a hostile provisioning network (issue 23's proof).

A qemu VM behind ``ipmi_sim`` is inspected and deployed by the daemon (authoritative DHCP,
the inspection ramdisk, the image written, the disk booted, its ``booted`` callback) while a
second namespace on the same bridge runs every attack of issue 23 in a loop
(``hostile_attacker.py``): a machine with its own MAC and a lease of its own from our DHCP
server, which forges DHCPDECLINEs and DISCOVERs in the VM's name, asks for the VM's boot
script, reports the VM's serial and MAC as its own, sends ``booted`` callbacks with every
token it holds, posts fabric scans, nested JSON, malformed HTTP and TFTP ERROR/ACK/DATA.

The VM must reach ``booted`` on time, at the address our DHCP server gave it; the attacker
must never hold a token of the VM's node; its own node never gains the VM's MAC; no
callback moves Ansible's target to the attacker; the TFTP listener answers none of its
datagrams; and the daemon's log stays bounded, however many rounds the attacker ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.disk_image import build_disk_image, missing_tool
from tests.e2e.test_bmc_pxe_qemu import cli, enroll_vm, vm_and_daemon
from tests.e2e.test_image_deploy_qemu import _config, _logs, _wait_state
from tests.e2e.test_pxe_qemu import Vm, _missing, build_ramdisk
from tests.peers.ipmi_sim import ipmi_sim_unavailable_reason
from tests.peers.netns import Namespace, bridged_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.root]
VM = Vm("disk", "52:54:00:77:00:30", "TEST-0300", 1, 768, uefi=False)
HOSTNAME = "vm-disk"
ATTACKER_MAC = "02:66:66:00:00:01"
ATTACKER = Path(__file__).with_name("hostile_attacker.py")
DISK_MIB = 96
LOG_LINES_MAX = 600  # a clean run of this flow logs about 150; bad input must not add more


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def attacker_namespace(ns: Namespace, work: Path) -> Iterator[tuple[Namespace, str]]:
    """A namespace whose ``eth0`` (MAC ``ATTACKER_MAC``) is bridged into ``ns``'s ``br0``,
    with a lease from our DHCP server (busybox udhcpc). Yields it and its address."""
    name = f"pa{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", ns.name, "link", "add", "att0", "type", "veth", "peer", "name", "eth0",
            "netns", name)
        _ip("-n", ns.name, "link", "set", "att0", "master", "br0", "up")
        _ip("-n", name, "link", "set", "eth0", "address", ATTACKER_MAC, "up")
        script = work / "udhcpc.sh"
        script.write_text('#!/bin/sh\ncase "$1" in bound|renew)\n'
                          '  ip addr flush dev "$interface"\n'
                          '  ip addr add "$ip/24" dev "$interface"\n'
                          '  echo "$ip" > "$(dirname "$0")/attacker-address";;\nesac\n')
        script.chmod(0o755)
        subprocess.run(["ip", "netns", "exec", name, "busybox", "udhcpc", "-i", "eth0",
                        "-q", "-n", "-t", "10", "-T", "2", "-s", str(script)],
                       check=True, capture_output=True, timeout=60)
        address = (work / "attacker-address").read_text().strip()
        yield Namespace(name=name, bridge_address=""), address
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def test_a_node_onboards_while_the_network_attacks_it(tmp_path: Path) -> None:
    reason = _missing() or ipmi_sim_unavailable_reason() or missing_tool()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "state"
    build_ramdisk(state / "artefacts")
    image = build_disk_image()
    served = state / "artefacts" / "images" / "disk.raw"
    served.parent.mkdir(parents=True)
    served.write_bytes(image.read_bytes())
    disk = tmp_path / "vm-disk.raw"
    disk.write_bytes(b"")
    os.truncate(disk, DISK_MIB << 20)
    victim_address = tmp_path / "victim-address"
    stop, out = tmp_path / "attacker-stop", tmp_path / "attacker.json"
    db = state / "provisioner.sqlite"
    with bridged_namespace() as ns:
        tap = ns.add_tap()
        config = tmp_path / "provisioner.toml"
        config.write_text(_config(state, hashlib.sha256(image.read_bytes()).hexdigest()))
        with vm_and_daemon(ns, tap, config, tmp_path, VM, [
                "-drive", f"file={disk},format=raw,if=virtio,cache=unsafe"]) as env, \
                attacker_namespace(ns, tmp_path) as (attacker_ns, attacker_address):
            enroll_vm(ns, config, env, tmp_path, HOSTNAME, "--profile", "e2e", vm=VM)
            attacker = subprocess.Popen(
                [*attacker_ns.exec_prefix(), sys.executable, str(ATTACKER),
                 "--server", "10.77.0.1", "--victim-mac", VM.mac, "--victim-serial",
                 VM.serial, "--victim-hostname", HOSTNAME, "--victim-address-file",
                 str(victim_address), "--own-mac", ATTACKER_MAC, "--own-address",
                 attacker_address, "--stop", str(stop), "--out", str(out)],
                stdout=subprocess.DEVNULL, stderr=(tmp_path / "attacker.log").open("wb"))
            try:
                cli(ns, config, "node", "action", HOSTNAME, "inspect", env=env)
                _wait_state(ns, config, env, tmp_path, {"inspected"}, 400)
                victim_address.write_text(_leased(db, VM.mac) or "")
                cli(ns, config, "node", "action", HOSTNAME, "deploy", env=env)
                _wait_booted(db, tmp_path, 700)
                time.sleep(5)  # the attacker's callbacks after the real one
            finally:
                stop.touch()
                attacker.wait(60)
    result = json.loads(out.read_text())
    node_id, macs, facts = _node(db, HOSTNAME)
    history = _node_history(db, node_id)
    assert result["rounds"] >= 40, result  # the attacks ran all along
    booted = [why for event, why in history if event == "booted"]
    assert len(booted) == 1, (history, _logs(tmp_path))
    vm_address = _leased(db, VM.mac)
    assert vm_address and vm_address != attacker_address
    assert booted[0] == f"hostname '{HOSTNAME}' from {vm_address}", booted
    assert facts.get("address") == vm_address  # Ansible's target is the VM, never us
    assert attacker_address not in json.dumps(facts)
    assert macs == [VM.mac], macs  # enrolled MACs only: no reported MAC was added
    held = _token_nodes(db, result["tokens"])
    assert node_id not in held.values(), (held, result["tokens"])
    for other in {n for n in held.values() if n is not None}:
        assert VM.mac not in _node_macs(db, other)  # the attacker's node never got it
        # its history stays bounded too: each kind of bad input, however many rounds it
        # came in, adds a burst and then rows ever further apart (lifecycle/row_budget.py)
        kinds = Counter(event for event, _ in _node_history(db, other))
        assert max(kinds.values()) <= 12, kinds
    assert result["tftp_replies"] == 0, result
    assert not Path("/tmp/pv-hostile-pwned").exists()
    lines = (tmp_path / "daemon.log").read_text(errors="replace").splitlines()
    assert len(lines) <= LOG_LINES_MAX, (len(lines), result["rounds"], lines[-40:])
    assert not [line for line in lines if "Traceback" in line], lines[-40:]


def _leased(db: Path, mac: str) -> str | None:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT ip FROM lease WHERE mac = ?", (mac,)).fetchone()
    return row[0] if row else None


def _node(db: Path, hostname: str) -> tuple[str, list[str], dict[str, object]]:
    with sqlite3.connect(db) as conn:
        node_id, facts = conn.execute("SELECT id, facts FROM node WHERE hostname = ?",
                                      (hostname,)).fetchone()
    return node_id, _node_macs(db, node_id), json.loads(facts)


def _node_macs(db: Path, node_id: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        return sorted(mac for (mac,) in conn.execute(
            "SELECT mac FROM node_mac WHERE node_id = ?", (node_id,)))


def _node_history(db: Path, node_id: str) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return [(event, why or "") for event, why in conn.execute(
            "SELECT event, reason FROM transition WHERE node_id = ? ORDER BY seq",
            (node_id,))]


def _wait_booted(db: Path, tmp_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            events = {event for (event,) in conn.execute(
                "SELECT t.event FROM transition t JOIN node n ON n.id = t.node_id "
                "WHERE n.hostname = ?", (HOSTNAME,))}
        if "booted" in events or "fail" in events:
            return
        time.sleep(3)
    pytest.fail("no booted callback in time: " + _logs(tmp_path))


def _token_nodes(db: Path, tokens: dict[str, str]) -> dict[str, str | None]:
    """Each token the attacker held that is still valid, with its node."""
    held: dict[str, str | None] = {}
    with sqlite3.connect(db) as conn:
        for token in tokens:
            digest = hashlib.sha256(token.encode()).hexdigest()
            row = conn.execute("SELECT node_id FROM api_token WHERE token_hash = ? AND "
                               "(expires_at IS NULL OR expires_at > datetime('now'))",
                               (digest,)).fetchone()
            if row is not None:
                held[tokens[token]] = row[0]
    return held
