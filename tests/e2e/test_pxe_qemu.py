"""Zero-touch discovery with firmware nobody here wrote: qemu VMs (TCG) in a network namespace
PXE-boot from the running daemon. One through SeaBIOS and the NIC's iPXE ROM, one through
OVMF's own UEFI PXE -> TFTP snponly.efi -> iPXE -> HTTP. Each arrives as ``discovered``,
boots the inspection ramdisk, and ends ``inspected`` with the serial, MAC, CPU count and
memory qemu was given; then its agent powers it off."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.daemon_proc import free_port
from tests.peers.netns import Namespace, bridged_namespace, netns_unavailable_reason

pytestmark = [pytest.mark.e2e, pytest.mark.root]
ROOT = Path(__file__).resolve().parents[2]
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")


@dataclass(frozen=True)
class Vm:
    name: str
    mac: str
    serial: str
    cpus: int
    memory_mib: int
    uefi: bool


VMS = [Vm("bios", "52:54:00:77:00:10", "TEST-0001", 1, 1024, uefi=False),
       Vm("uefi", "52:54:00:77:00:11", "TEST-0002", 2, 768, uefi=True)]


def _missing() -> str | None:
    reason = netns_unavailable_reason()
    if reason:
        return reason
    for tool in ("qemu-system-x86_64",):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh installs it)"
    return None


def build_ramdisk(artefacts: Path) -> None:
    out = subprocess.run(["bash", str(ROOT / "pxe/ramdisk/build.sh")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    (artefacts / "inspect").mkdir(parents=True)
    for name in ("vmlinuz", "initrd.gz"):
        shutil.copy(Path(out) / name, artefacts / "inspect" / name)


def qemu_command(ns: Namespace, vm: Vm, tap: str, workdir: Path) -> list[str]:
    nic = f"virtio-net-pci,netdev=n0,mac={vm.mac},bootindex=1"
    cmd = [*ns.exec_prefix(), "qemu-system-x86_64", "-machine", "q35,accel=tcg",
           "-cpu", "qemu64", "-m", str(vm.memory_mib), "-smp", str(vm.cpus), "-nographic",
           "-vga", "none", "-no-reboot", "-netdev", f"tap,id=n0,ifname={tap},script=no,"
           "downscript=no", "-smbios", f"type=1,manufacturer=TestVendor,product=TestNode,"
           f"serial={vm.serial}", "-uuid", f"5c0f0000-0000-4000-8000-0000000000{vm.mac[-2:]}"]
    if vm.uefi:  # the firmware's own PXE (no iPXE option ROM): TFTP snponly.efi first
        vars_copy = workdir / f"{vm.name}-vars.fd"
        shutil.copy(OVMF_VARS, vars_copy)
        nic += ",romfile="
        cmd += ["-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
                "-drive", f"if=pflash,format=raw,unit=1,file={vars_copy}"]
    return [*cmd, "-device", nic]


def segment_config(state: Path, *, tftp: bool = True, extra: str = "",
                   api: str | None = None, lifecycle: str = "auto_deploy = false") -> str:
    """``provisioner serve`` answering the namespace's segment (br0, 10.77.0.0/24); ``api``:
    its API address (default a free loopback port), ``lifecycle``: that section's lines."""
    return (f'state_dir = "{state}"\n[api]\nlisten = "{api or f"127.0.0.1:{free_port()}"}"\n'
            f'[lifecycle]\n{lifecycle}\n'
            '[dhcp]\nmode = "authoritative"\ninterface = "br0"\n'
            'server_address = "10.77.0.1"\npool = "10.77.0.100-10.77.0.199"\n'
            + ('[tftp]\nlisten = "10.77.0.1:69"\n' if tftp else "")
            + '[http]\nlisten = "10.77.0.1:8080"\n' + extra)


@contextmanager
def serving(ns: Namespace, config: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``provisioner serve`` in the namespace, its output in ``log_path``; stopped at the end."""
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            [*ns.exec_prefix(), sys.executable, "-m", "provisioner", "--config", str(config),
             "serve"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield daemon
        finally:
            daemon.terminate()
            daemon.wait(30)


def run_until_off(commands: list[list[str]], consoles: list[Path], timeout_s: float,
                  logs: Callable[[], str]) -> None:
    """Start the VMs (each console to its file) and wait until every one has powered off,
    as the ramdisk does after its report; a VM still running at the deadline fails the test."""
    vms: list[subprocess.Popen[bytes]] = []
    try:
        for command, console in zip(commands, consoles, strict=True):
            with console.open("wb") as out:
                vms.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout_s
        for proc in vms:
            proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail("a VM did not power off in time: " + logs())
    finally:
        for proc in vms:
            proc.kill()


def node_rows(db: Path) -> dict[str, tuple[str, str | None, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT m.mac, n.state, n.serial, n.facts FROM node n "
                            "JOIN node_mac m ON m.node_id = n.id").fetchall()
    return {mac: (state, serial, facts) for mac, state, serial, facts in rows}


def test_two_vms_pxe_boot_into_inspection(tmp_path: Path) -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    import json

    state = tmp_path / "state"
    build_ramdisk(state / "artefacts")
    with bridged_namespace() as ns:
        taps = [ns.add_tap() for _ in VMS]
        config = tmp_path / "provisioner.toml"
        config.write_text(segment_config(state))
        with serving(ns, config, tmp_path / "daemon.log") as daemon:
            _wait_for_http(ns, daemon, tmp_path)
            commands = [qemu_command(ns, vm, tap, tmp_path)
                        for vm, tap in zip(VMS, taps, strict=True)]
            run_until_off(commands,
                          [tmp_path / f"{vm.name}.console" for vm in VMS], 240,
                          lambda: _logs(tmp_path))
    rows = node_rows(state / "provisioner.sqlite")
    for vm in VMS:
        assert vm.mac in rows, f"{vm.name} never arrived: " + _logs(tmp_path)
        node_state, serial, facts_json = rows[vm.mac]
        facts = json.loads(facts_json)["last_report"]
        assert (node_state, serial) == ("inspected", vm.serial), _logs(tmp_path)
        assert facts["cpu"]["cores"] == vm.cpus
        assert 0.8 * vm.memory_mib < facts["memory_mib"] <= vm.memory_mib
        assert vm.mac in {nic["mac"] for nic in facts["nics"]}
        assert facts["system"]["vendor"] == "TestVendor"


def _wait_for_http(ns: Namespace, daemon: subprocess.Popen[bytes], tmp_path: Path) -> None:
    for _ in range(150):
        if daemon.poll() is not None:
            pytest.fail("daemon exited: " + _logs(tmp_path))
        probe = subprocess.run([*ns.exec_prefix(), "curl", "-fsS", "-o", "/dev/null",
                                "http://10.77.0.1:8080/boot.ipxe"], capture_output=True)
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    pytest.fail("boot HTTP never came up: " + _logs(tmp_path))


def _logs(tmp_path: Path) -> str:
    parts = []
    for name in ("daemon.log", "bios.console", "uefi.console"):
        path = tmp_path / name
        if path.exists():
            text = path.read_text(errors="replace")
            parts.append(f"--- {name} ---\n{text[-3000:]}")
    return "\n".join(parts)


def test_x86_uefi_http_boot_without_tftp(tmp_path: Path) -> None:
    """OVMF with its PXE switched off (``opt/org.tianocore/IPv4PXESupport=no``, and IPv6)
    boots over UEFI HTTP: the daemon's offer echoes ``HTTPClient`` and carries the iPXE EFI's
    full http:// URL. No TFTP server is even configured. The VM ends ``inspected``."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    import json

    vm = Vm("http", "52:54:00:77:00:12", "TEST-0003", 1, 768, uefi=True)
    state = tmp_path / "state"
    build_ramdisk(state / "artefacts")
    with bridged_namespace() as ns:
        tap = ns.add_tap()
        config = tmp_path / "provisioner.toml"
        config.write_text(segment_config(state, tftp=False,
                                         extra='[boot]\nramdisk_build = "off"\n'))
        with serving(ns, config, tmp_path / "daemon.log") as daemon:
            _wait_for_http(ns, daemon, tmp_path)
            pxe_off = ["-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=no",
                       "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=no"]
            run_until_off([[*qemu_command(ns, vm, tap, tmp_path), *pxe_off]],
                          [tmp_path / "uefi.console"], 240, lambda: _logs(tmp_path))
    daemon_log = (tmp_path / "daemon.log").read_text()
    console_text = (tmp_path / "uefi.console").read_text(errors="replace")
    rows = node_rows(state / "provisioner.sqlite")
    assert vm.mac in rows, "the VM never arrived: " + _logs(tmp_path)
    node_state, serial, facts_json = rows[vm.mac]
    assert (node_state, serial) == ("inspected", vm.serial), _logs(tmp_path)
    assert json.loads(facts_json)["last_report"]["cpu"]["arch"] == "x86_64"
    assert "boot file http://10.77.0.1:8080/ipxe/snponly.efi" in daemon_log
    assert "HTTP Boot" in console_text and "PXE" not in console_text.split("HTTP Boot")[0]
    assert "TFTP" not in daemon_log
