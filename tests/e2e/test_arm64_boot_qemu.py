"""Grace (arm64) nodes boot from the daemon with firmware nobody here wrote: qemu-system-aarch64
(TCG, ``-machine virt -cpu cortex-a57``) with AAVMF from Debian's ``qemu-efi-aarch64``.

The daemon starts on an EMPTY state dir: it builds the arm64 inspection ramdisk (Debian's arm64
kernel, busybox and python3 from arm64 .debs) and the arm64 GRUB netboot image by itself, in
the background. Then two VMs boot at once:
- ``pxe``: the firmware's own PXE -> TFTP GRUB -> ``/boot/<mac>.grub`` -> kernel + ramdisk;
- ``http``: UEFI HTTP boot (client arch 19; the firmware's PXE switched off): the DHCP offer
  carries the GRUB image's http:// URL and echoes ``HTTPClient``; no TFTP transfer.
Both end ``inspected`` with the serial given by ``-smbios`` and ``cpu.arch`` ``aarch64``; the
CLI's ``node show --json`` carries the architecture.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisioner.ramdisk.sysroot import arch_named, fetch_debs
from tests.e2e.daemon_proc import free_port
from tests.peers.netns import Namespace, bridged_namespace, netns_unavailable_reason

pytestmark = [pytest.mark.e2e, pytest.mark.root]
AAVMF_CODE = Path("/usr/share/AAVMF/AAVMF_CODE.fd")
AAVMF_VARS = Path("/usr/share/AAVMF/AAVMF_VARS.fd")
PXE_OFF = ["-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=no",
           "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=no"]


@dataclass(frozen=True)
class Vm:
    name: str
    mac: str
    serial: str
    http_boot: bool


VMS = [Vm("pxe", "52:54:00:77:00:a0", "GRACE-0001", http_boot=False),
       Vm("http", "52:54:00:77:00:a1", "GRACE-0002", http_boot=True)]


def missing_peer() -> str | None:
    reason = netns_unavailable_reason()
    if reason:
        return reason
    for tool in ("qemu-system-aarch64", "grub-mkimage", "apt-get", "readelf", "cpio"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh installs it)"
    if not AAVMF_CODE.is_file():
        return "AAVMF is not installed (qemu-efi-aarch64; scripts/setup.sh installs it)"
    probe = subprocess.run(["apt-cache", "show", "busybox-static:arm64"], capture_output=True)
    if probe.returncode != 0:
        return "apt has no arm64 packages (scripts/setup.sh runs dpkg --add-architecture arm64)"
    return None


def aarch64_command(ns: Namespace, vm: Vm, tap: str, workdir: Path,
                    extra: list[str] | None = None) -> list[str]:
    vars_copy = workdir / f"{vm.name}-vars.fd"
    shutil.copy(AAVMF_VARS, vars_copy)
    cmd = [*ns.exec_prefix(), "qemu-system-aarch64", "-machine", "virt", "-cpu", "cortex-a57",
           "-m", "1024", "-smp", "1", "-nographic", "-no-reboot",
           "-drive", f"if=pflash,format=raw,readonly=on,file={AAVMF_CODE}",
           "-drive", f"if=pflash,format=raw,file={vars_copy}",
           "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no",
           "-device", f"virtio-net-pci,netdev=n0,mac={vm.mac},romfile=",
           "-smbios", f"type=1,manufacturer=TestVendor,product=GraceNode,serial={vm.serial}"]
    if vm.http_boot:
        cmd += PXE_OFF
    return cmd + (extra or [])


@pytest.fixture(scope="session")
def arm64_debs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding the arm64 .debs, fetched here in the root namespace: the daemons
    under test run in namespaces without a route to the Debian mirror, like an air-gapped
    management host whose operator copied the packages in (docs/operator-guide.md)."""
    reason = missing_peer()
    if reason:
        pytest.skip(reason)
    cache = tmp_path_factory.mktemp("arm64-cache")
    fetch_debs(arch_named("arm64"), cache / "debs-arm64")
    return cache


def wait_for_log(path: Path, needle: str, daemon: subprocess.Popen[bytes],
                 timeout_s: float, failure: str = "ramdisk not built") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace")
        if needle in text:
            return
        if failure in text:
            pytest.fail(f"{failure}: {text[-3000:]}")
        if daemon.poll() is not None:
            pytest.fail(f"daemon exited: {path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"no {needle!r} in the daemon log: {path.read_text(errors='replace')[-3000:]}")


def test_arm64_pxe_and_http_boot_into_inspection(tmp_path: Path, arm64_debs: Path) -> None:
    state = tmp_path / "state"  # empty: the daemon builds its own ramdisk and GRUB image
    api_port = free_port()
    with bridged_namespace() as ns:
        taps = [ns.add_tap() for _ in VMS]
        config = tmp_path / "provisioner.toml"
        config.write_text(
            f'state_dir = "{state}"\n[api]\nlisten = "127.0.0.1:{api_port}"\n'
            '[lifecycle]\nauto_deploy = false\n'
            '[dhcp]\nmode = "authoritative"\ninterface = "br0"\n'
            'server_address = "10.77.0.1"\npool = "10.77.0.100-10.77.0.199"\n'
            '[tftp]\nlisten = "10.77.0.1:69"\n[http]\nlisten = "10.77.0.1:8080"\n'
            f'[boot]\nramdisk_arches = ["arm64"]\ncache_dir = "{arm64_debs}"\n')
        log_path = tmp_path / "daemon.log"
        log = log_path.open("wb")
        daemon = subprocess.Popen(
            [*ns.exec_prefix(), sys.executable, "-m", "provisioner", "--config", str(config),
             "serve"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        vms: list[subprocess.Popen[bytes]] = []
        try:
            wait_for_log(log_path, "arm64 inspection ramdisk ready", daemon, 240)
            for vm, tap in zip(VMS, taps, strict=True):
                console = (tmp_path / f"{vm.name}.console").open("wb")
                vms.append(subprocess.Popen(aarch64_command(ns, vm, tap, tmp_path),
                                            stdout=console, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL))
            deadline = time.monotonic() + 420
            for proc in vms:
                proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail("a VM did not power off in time: " + logs(tmp_path))
        finally:
            for proc in vms:
                proc.kill()
            daemon.terminate()
            daemon.wait(30)
            log.close()
    daemon_log = log_path.read_text(errors="replace")
    rows = node_rows(state / "provisioner.sqlite")
    for vm in VMS:
        assert vm.mac in rows, f"{vm.name} never arrived: " + logs(tmp_path)
        node_state, serial, facts_json = rows[vm.mac]
        assert (node_state, serial) == ("inspected", vm.serial), logs(tmp_path)
        facts = json.loads(facts_json)["last_report"]
        assert facts["cpu"]["arch"] == "aarch64"
        assert vm.mac in {nic["mac"] for nic in facts["nics"]}
    assert "boot file grubaa64.efi" in daemon_log  # PXE: TFTP first stage
    assert "boot file http://10.77.0.1:8080/ipxe/grubaa64.efi" in daemon_log  # HTTP boot
    tftp_clients = [line for line in daemon_log.splitlines() if "TFTP: sent grubaa64.efi" in line]
    assert len(tftp_clients) >= 1
    http_lease = next(line for line in daemon_log.splitlines()
                      if VMS[1].mac in line and "bound" in line)
    http_ip = http_lease.split("bound ")[1].split()[0]
    assert not any(f"to {http_ip} " in line for line in tftp_clients), \
        "the HTTP-booted VM fetched over TFTP"


def node_rows(db: Path) -> dict[str, tuple[str, str | None, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT m.mac, n.state, n.serial, n.facts FROM node n "
                            "JOIN node_mac m ON m.node_id = n.id").fetchall()
    return {mac: (state, serial, facts) for mac, state, serial, facts in rows}


def logs(tmp_path: Path) -> str:
    parts = []
    for path in sorted(tmp_path.glob("*.console")) + [tmp_path / "daemon.log"]:
        if path.exists():
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)
