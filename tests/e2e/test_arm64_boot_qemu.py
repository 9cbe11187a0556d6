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

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provisioner.ramdisk.sysroot import arch_named, fetch_debs, foreign_sysroot
from tests.e2e.test_pxe_qemu import node_rows, run_until_off, segment_config, serving
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
           "-smbios", f"type=1,manufacturer=TestVendor,product=GraceNode,serial={vm.serial}"]
    if vm.http_boot:
        cmd += PXE_OFF
    # the NIC last: the IPMI chassis (tests/peers/chassis_vm.py) adds its boot order
    return [*cmd, *(extra or []), "-device", f"virtio-net-pci,netdev=n0,mac={vm.mac},romfile="]


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


def wait_for_log(path: Path, needle: str, daemon: subprocess.Popen[bytes] | _NoProcess,
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
    log_path = tmp_path / "daemon.log"
    with bridged_namespace() as ns:
        taps = [ns.add_tap() for _ in VMS]
        config = tmp_path / "provisioner.toml"
        config.write_text(segment_config(state, extra=(
            f'[boot]\nramdisk_arches = ["arm64"]\ncache_dir = "{arm64_debs}"\n')))
        with serving(ns, config, log_path) as daemon:
            wait_for_log(log_path, "arm64 inspection ramdisk ready", daemon, 240)
            commands = [aarch64_command(ns, vm, tap, tmp_path)
                        for vm, tap in zip(VMS, taps, strict=True)]
            run_until_off(commands,
                          [tmp_path / f"{vm.name}.console" for vm in VMS], 420,
                          lambda: logs(tmp_path))
    daemon_log = log_path.read_text(errors="replace")
    rows = node_rows(state / "provisioner.sqlite")
    for vm in VMS:
        assert vm.mac in rows, f"{vm.name} never arrived: " + logs(tmp_path)
        node_state, serial, facts_json = rows[vm.mac]
        assert (node_state, serial) == ("inspected", vm.serial), logs(tmp_path)
        facts = json.loads(facts_json)["last_report"]
        assert facts["cpu"]["arch"] == "aarch64"
        assert vm.mac in {nic["mac"] for nic in facts["nics"]}
        # the arm64 ramdisk carries the InfiniBand stack and says whether it loaded it
        assert facts["infiniband_driver"] == {"loaded": False, "modules": [],
                                              "mellanox_functions": 0}, logs(tmp_path)
        assert "no Mellanox HCA, InfiniBand stack not loaded" in (
            tmp_path / f"{vm.name}.console").read_text(errors="replace")
    assert "boot file grubaa64.efi" in daemon_log  # PXE: TFTP first stage
    assert "boot file http://10.77.0.1:8080/ipxe/grubaa64.efi" in daemon_log  # HTTP boot
    tftp_clients = [line for line in daemon_log.splitlines() if "TFTP: sent grubaa64.efi" in line]
    assert len(tftp_clients) >= 1
    http_lease = next(line for line in daemon_log.splitlines()
                      if VMS[1].mac in line and "bound" in line)
    http_ip = http_lease.split("bound ")[1].split()[0]
    assert not any(f"to {http_ip} " in line for line in tftp_clients), \
        "the HTTP-booted VM fetched over TFTP"


def logs(tmp_path: Path) -> str:
    parts = []
    for path in [*sorted(tmp_path.glob("*.console")), tmp_path / "daemon.log",
                 tmp_path / "bmc" / "serial.log", tmp_path / "bmc" / "chassis.log"]:
        if path.exists():
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


@pytest.mark.timeout(900)  # TCG: two arm64 boots and a 96 MiB image write
def test_arm64_deploy_boots_the_disk_and_calls_back(tmp_path: Path, arm64_debs: Path) -> None:
    """The Grace deploy path: a qemu-system-aarch64 VM whose BMC is ``ipmi_sim`` (its chassis
    starts and stops the VM) is inspected, then deployed with a bootable arm64 GPT image (an
    EFI System Partition with GRUB at EFI/BOOT/BOOTAA64.EFI, the Debian arm64 kernel and a
    busybox initramfs that reads the cloud-init seed). The agent writes it, the daemon sets
    the next boot to disk and power-cycles the VM over IPMI; AAVMF boots the disk and its init
    posts ``booted`` with the hostname the daemon put in the seed."""
    from tests.e2e.disk_image import build_arm64_disk_image, missing_tool
    from tests.e2e.test_bmc_pxe_qemu import cli, enroll_vm, vm_and_daemon
    from tests.e2e.test_image_deploy_qemu import _history, _wait_booted
    from tests.peers.ipmi_sim import ipmi_sim_unavailable_reason

    reason = ipmi_sim_unavailable_reason() or missing_tool()
    if reason:
        pytest.skip(reason)
    sysroot = foreign_sysroot(arch_named("arm64"), arm64_debs)
    image = build_arm64_disk_image(sysroot.root, sysroot.kernel_version, arm64_debs)
    state = tmp_path / "state"
    served = state / "artefacts" / "images" / "disk.raw"
    served.parent.mkdir(parents=True)
    served.write_bytes(image.read_bytes())
    sha256 = hashlib.sha256(served.read_bytes()).hexdigest()
    disk = tmp_path / "vm-disk.raw"
    disk.write_bytes(b"")
    os.truncate(disk, 96 << 20)
    vm = Vm("grace", "52:54:00:77:00:b0", "GRACE-0100", http_boot=False)
    hostname = "grace-disk"
    with bridged_namespace() as ns:
        tap = ns.add_tap()
        config = tmp_path / "provisioner.toml"
        config.write_text(segment_config(
            state, api="127.0.0.1:8700",  # the address test_bmc_pxe_qemu's cli() asks
            lifecycle="auto_inspect = false\nauto_deploy = false",
            extra=f'[boot]\nramdisk_arches = ["arm64"]\ncache_dir = "{arm64_debs}"\n'
            '[bmc]\ntimeout_s = 10\n[deploy]\ncallback_timeout_s = 900\n'
            f'[images.grace]\nurl = "images/disk.raw"\nsha256 = "{sha256}"\n'
            'root_disk = "smallest"\n'))
        # a BMC-driven machine reboots on reset (GRUB's `reboot` when it found no
        # configuration), as hardware does; -no-reboot would turn it off for good
        qemu = [a for a in aarch64_command(ns, vm, tap, tmp_path) if a != "-no-reboot"]
        with vm_and_daemon(ns, tap, config, tmp_path, qemu=qemu,  # type: ignore[arg-type]
                           disk="virtio-blk-pci,drive=d0",
                           extra=["-drive", f"file={disk},format=raw,if=none,id=d0,"
                                  "cache=unsafe"]) as env:
            wait_for_log(tmp_path / "daemon.log", "arm64 inspection ramdisk ready",
                         _NoProcess(), 240)
            enroll_vm(ns, config, env, tmp_path, hostname, "--profile", "grace",
                      vm=vm)  # type: ignore[arg-type]
            cli(ns, config, "node", "action", hostname, "inspect", env=env)
            inspected = wait_state(lambda: json.loads(cli(ns, config, "node", "show", hostname,
                                                          "--json", env=env)),
                                   "inspected", 400, tmp_path)
            cli(ns, config, "node", "action", hostname, "deploy", env=env)
            _wait_booted(tmp_path, 600)
    history = _history(state / "provisioner.sqlite")
    events = [event for event, _ in history]
    assert inspected["facts"]["last_report"]["cpu"]["arch"] == "aarch64"  # node show --json
    assert "image_written" in events and "booted" in events, (history, logs(tmp_path))
    assert events.index("image_written") < events.index("booted")
    booted = [r for e, r in history if e == "booted"]
    assert booted[0].startswith(f"hostname '{hostname}' from 10.77.0."), history
    serial = (tmp_path / "bmc" / "serial.log").read_text(errors="replace")
    assert "disk-os: GRUB from the disk" in serial and f"hostname {hostname}" in serial
    sets = (tmp_path / "bmc" / "chassis.log").read_text().splitlines()
    assert "set boot pxe" in sets and sets.index("set boot pxe") < sets.index("set power 1")


def wait_state(show: Callable[[], dict[str, Any]], wanted: str, timeout_s: float,
               tmp_path: Path) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    shown: dict[str, Any] = {}
    while time.monotonic() < deadline:
        shown = show()
        if shown["state"] == wanted or str(shown["state"]).endswith("_failed"):
            break
        time.sleep(3)
    assert shown.get("state") == wanted, (shown, logs(tmp_path))
    return shown


class _NoProcess:
    """``wait_for_log`` for a daemon that ``vm_and_daemon`` owns."""

    @staticmethod
    def poll() -> None:
        return None
