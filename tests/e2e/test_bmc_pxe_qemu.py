"""BMC-driven inspection end to end: OpenIPMI's ``ipmi_sim`` is the BMC of a qemu VM (its
chassis control starts and stops the VM). An operator enrolls the node with its BMC through
the CLI and asks for ``inspect``: the daemon sets the boot device to PXE and powers the VM on
over IPMI; the VM PXE-boots from the daemon, its agent reports, and the daemon powers it off
over IPMI at the end."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.test_pxe_qemu import Vm, _missing, build_ramdisk, qemu_command
from tests.peers.ipmi_sim import (
    PASSWORD,
    USER,
    emu_commands,
    ipmi_sim_unavailable_reason,
    lan_conf,
)
from tests.peers.netns import Namespace, bridged_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.root]
VM = Vm("ipmi", "52:54:00:77:00:20", "TEST-0100", 1, 768, uefi=False)
CHASSIS = Path(__file__).resolve().parents[1] / "peers" / "chassis_vm.py"


def start_ipmi_sim(ns: Namespace, work: Path, tap: str, vm: Vm = VM,
                   extra: Sequence[str] = (), qemu: Sequence[str] | None = None,
                   disk: str | None = None) -> subprocess.Popen[bytes]:
    """ipmi_sim whose chassis runs ``vm`` (``extra``: more qemu arguments, e.g. a disk).
    ``qemu``: another machine's command (e.g. qemu-system-aarch64), ending in its NIC's
    ``-device``; ``disk``: a UEFI machine's disk ``-device``, to which the chassis gives the
    boot order (the firmware's own PXE cannot be removed, so the boot device is an order)."""
    (work / "state").mkdir(parents=True)
    command = list(qemu or qemu_command(ns, vm, tap, work))[len(ns.exec_prefix()):]
    nic = command.pop()  # "-device" "<nic>": the chassis adds the boot order to it
    command.pop()
    command += extra
    command.remove("-nographic")  # qemu refuses it with -daemonize; the chassis adds
    # -display none and a serial log file instead
    vm_json: dict[str, object] = {"qemu": command, "nic": nic.replace(",bootindex=1", "")}
    if disk is not None:
        vm_json["disk"] = disk
    (work / "vm.json").write_text(json.dumps(vm_json))
    lan = lan_conf(address="10.77.0.1", port=623, d=work).replace(
        f'"{work}/chassisctl.sh 0x20"', f'"{sys.executable} {CHASSIS} {work} 0x20"')
    (work / "lan.conf").write_text(lan)
    (work / "bmc.emu").write_text(emu_commands())
    proc = subprocess.Popen([*ns.exec_prefix(), "ipmi_sim", "-c", str(work / "lan.conf"),
                             "-f", str(work / "bmc.emu"), "-s", str(work / "state"), "-n"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    probe = [*ns.exec_prefix(), "ipmitool", "-I", "lanplus", "-C", "3", "-H", "10.77.0.1",
             "-U", USER, "-P", PASSWORD, "-N", "1", "-R", "1", "chassis", "power", "status"]
    for _ in range(100):
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return proc
        time.sleep(0.2)
    proc.kill()
    pytest.fail("ipmi_sim did not answer")


def cli(ns: Namespace, config: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([*ns.exec_prefix(), sys.executable, "-m", "provisioner",
                             "--config", str(config), *args], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@contextmanager
def vm_and_daemon(ns: Namespace, tap: str, config: Path, tmp_path: Path, vm: Vm = VM,
                  extra: Sequence[str] = (), qemu: Sequence[str] | None = None,
                  disk: str | None = None) -> Iterator[dict[str, str]]:
    """ipmi_sim (its chassis owns the qemu VM, its files in ``tmp_path/bmc``) and
    ``provisioner serve`` in the namespace; yields the CLI's environment (an operator token).
    At the end the VM is powered off and both are stopped."""
    bmc_dir = tmp_path / "bmc"
    bmc = start_ipmi_sim(ns, bmc_dir, tap, vm, extra, qemu, disk)
    token = cli(ns, config, "token", "create", "--role", "operator", "--name", "e2e")
    env = dict(os.environ, PROVISIONER_TOKEN=token.strip().splitlines()[-1])
    with (tmp_path / "daemon.log").open("wb") as log:
        daemon = subprocess.Popen(
            [*ns.exec_prefix(), sys.executable, "-m", "provisioner", "--config", str(config),
             "serve"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _wait_api(ns, daemon)
            yield env
        finally:
            subprocess.run([sys.executable, str(CHASSIS), str(bmc_dir), "0x20", "set",
                            "power", "0"], check=False)
            bmc.terminate()
            daemon.terminate()
            daemon.wait(30)


def enroll_vm(ns: Namespace, config: Path, env: dict[str, str], tmp_path: Path,
              hostname: str, *more: str, vm: Vm = VM) -> None:
    """``node enroll`` of the VM with its BMC (the password from a file, never argv)."""
    password = tmp_path / "bmc-password"
    password.write_text(PASSWORD + "\n")
    cli(ns, config, "node", "enroll", "--hostname", hostname, "--mac", vm.mac, "--serial",
        vm.serial, *more, "--bmc-driver", "ipmi", "--bmc-address", "10.77.0.1",
        "--bmc-port", "623", "--bmc-username", USER, "--bmc-password-file", str(password),
        env=env)


def test_inspect_through_ipmi_powers_the_vm_on_and_off(tmp_path: Path) -> None:
    reason = _missing() or ipmi_sim_unavailable_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "state"
    build_ramdisk(state / "artefacts")
    bmc_dir = tmp_path / "bmc"
    with bridged_namespace() as ns:
        tap = ns.add_tap()
        config = tmp_path / "provisioner.toml"
        config.write_text(
            f'state_dir = "{state}"\n[api]\nlisten = "127.0.0.1:8700"\n'
            "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n"
            '[dhcp]\nmode = "authoritative"\ninterface = "br0"\n'
            'server_address = "10.77.0.1"\npool = "10.77.0.100-10.77.0.199"\n'
            '[http]\nlisten = "10.77.0.1:8080"\n[bmc]\ntimeout_s = 10\n')
        with vm_and_daemon(ns, tap, config, tmp_path) as env:
            enroll_vm(ns, config, env, tmp_path, "vm-ipmi")
            cli(ns, config, "node", "action", "vm-ipmi", "inspect", env=env)
            shown = _wait_inspected(ns, config, env, tmp_path)
    calls = (bmc_dir / "chassis.log").read_text().splitlines()
    sets = [c for c in calls if c.startswith("set")]
    assert sets.index("set boot pxe") < sets.index("set power 1") < sets.index("set power 0")
    assert shown["serial"] == VM.serial and shown["facts"]["last_report"]["cpu"]["cores"] == 1
    assert "hunter" not in json.dumps(shown) and shown["bmc"]["password_set"] is True
    with sqlite3.connect(state / "provisioner.sqlite") as conn:
        events = [e for (e,) in conn.execute("SELECT event FROM transition ORDER BY id")]
    assert events[:3] == ["enroll", "inspect", "done"]


def _wait_api(ns: Namespace, daemon: subprocess.Popen[bytes]) -> None:
    for _ in range(150):
        if daemon.poll() is not None:
            pytest.fail("daemon exited")
        probe = subprocess.run([*ns.exec_prefix(), "curl", "-fsS", "-o", "/dev/null",
                                "http://127.0.0.1:8700/healthz"], capture_output=True)
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    pytest.fail("API never came up")


def _wait_inspected(ns: Namespace, config: Path, env: dict[str, str],
                    tmp_path: Path) -> dict[str, object]:
    deadline = time.monotonic() + 240
    shown: dict[str, object] = {}
    while time.monotonic() < deadline:
        shown = json.loads(cli(ns, config, "node", "show", "vm-ipmi", "--json", env=env))
        if shown["state"] in ("inspected", "inspect_failed"):
            break
        time.sleep(2)
    assert shown.get("state") == "inspected", (
        shown, (tmp_path / "daemon.log").read_text()[-3000:],
        (tmp_path / "bmc" / "serial.log").read_text(errors="replace")[-2000:]
        if (tmp_path / "bmc" / "serial.log").exists() else "no serial log")
    return shown
