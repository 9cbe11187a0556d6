"""Sanitisation on ``retire`` end to end (issue 25's proof): a qemu VM whose BMC is
``ipmi_sim`` has an emulated NVMe disk and a SATA disk (AHCI), both full of a known pattern.
Retiring it netboots our ramdisk, whose agent erases each disk by the strongest method the
drive offers and verifies it by sampled reads.

qemu's NVMe controller offers Format NVM (no Sanitize): the NVMe disk is erased with a Format
(the history row names the method) and the pattern is gone from its image file. qemu's SATA
disk offers no ATA security erase: with the profile not allowing an overwrite the step fails
naming that disk (whose image still holds the pattern); with ``sanitise_overwrite`` the retried
retire overwrites it with zeros, verified, and the node ends ``retired``, although the daemon
is SIGKILLed in the middle of that overwrite: the restarted daemon resumes the step and the
agent answers its repeated job from memory, without a second erase."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.test_bmc_pxe_qemu import _wait_api, cli, enroll_vm, vm_and_daemon
from tests.e2e.test_image_deploy_qemu import _history
from tests.e2e.test_pxe_qemu import Vm, _missing, build_ramdisk, serving
from tests.peers.ipmi_sim import ipmi_sim_unavailable_reason
from tests.peers.netns import Namespace, bridged_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.root]
VM = Vm("erase", "52:54:00:77:00:40", "TEST-0400", 1, 768, uefi=False)
HOSTNAME = "vm-erase"
PATTERN = b"TENANT-SECRET-0400:"
NVME_MIB, SATA_MIB = 64, 128  # the SATA overwrite lasts long enough to kill the daemon in it


def _config(state: Path, *, overwrite: bool) -> str:
    return (
        f'state_dir = "{state}"\n[api]\nlisten = "127.0.0.1:8700"\n'
        "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n"
        '[dhcp]\nmode = "authoritative"\ninterface = "br0"\n'
        'server_address = "10.77.0.1"\npool = "10.77.0.100-10.77.0.199"\n'
        '[http]\nlisten = "10.77.0.1:8080"\n[bmc]\ntimeout_s = 10\n'
        + ("[servicing.profiles.e2e]\nsanitise_overwrite = true\n" if overwrite else ""))


def _image(path: Path, mib: int) -> bytes:
    block = (PATTERN * (4096 // len(PATTERN) + 1))[:4096]
    path.write_bytes(block * (mib * 256))
    return path.read_bytes()


def _disks(nvme: Path, sata: Path) -> list[str]:
    return ["-drive", f"file={nvme},format=raw,if=none,id=nv0",
            "-device", "nvme,serial=NV-0400,drive=nv0",
            "-drive", f"file={sata},format=raw,if=none,id=sata0",
            "-device", "ahci,id=ahci0", "-device", "ide-hd,drive=sata0,bus=ahci0.0"]


def _wait(ns: Namespace, config: Path, env: dict[str, str], wanted: str,
          timeout_s: float, logs: Path) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    shown: dict[str, object] = {}
    while time.monotonic() < deadline:
        shown = json.loads(cli(ns, config, "node", "show", HOSTNAME, "--json", env=env))
        if shown["state"] == wanted or str(shown["state"]).endswith("_failed"):
            break
        time.sleep(2)
    assert shown.get("state") == wanted, (shown, _tail(logs))
    return shown


def _wait_line(path: Path, line: str, timeout_s: float, run: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and line in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    pytest.fail(f"no {line!r} in time: {_tail(run)}")


def _daemon_pid(config: Path) -> int:
    """The ``provisioner serve`` that vm_and_daemon started with this test's config."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(config).encode() in argv and b"serve" in argv and b"provisioner" in argv:
            return int(proc.name)
    pytest.fail("the daemon is not running")


def _tail(run: Path) -> str:
    parts = []
    for path in (run / "daemon.log", run / "bmc" / "serial.log"):
        if path.exists():
            parts.append(f"--- {path} ---\n{path.read_text(errors='replace')[-5000:]}")
    return "\n".join(parts)


def test_retire_erases_each_disk_by_its_method_and_fails_on_one_it_cannot(
        tmp_path: Path) -> None:
    reason = _missing() or ipmi_sim_unavailable_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "state"
    build_ramdisk(state / "artefacts")
    nvme, sata = tmp_path / "nvme.raw", tmp_path / "sata.raw"
    _image(nvme, NVME_MIB)
    sata_before = _image(sata, SATA_MIB)
    config = tmp_path / "provisioner.toml"
    strict, lenient = tmp_path / "strict", tmp_path / "lenient"
    with bridged_namespace() as ns:
        tap = ns.add_tap()
        config.write_text(_config(state, overwrite=False))
        with vm_and_daemon(ns, tap, config, strict, VM, _disks(nvme, sata)) as env:
            enroll_vm(ns, config, env, strict, HOSTNAME, "--profile", "e2e", vm=VM)
            cli(ns, config, "node", "action", HOSTNAME, "retire", env=env)
            failed = _wait(ns, config, env, "retire_failed", 300, strict)
        first = _history(state / "provisioner.sqlite")
        nvme_after_first = nvme.read_bytes()
        sata_after_first = sata.read_bytes()
        config.write_text(_config(state, overwrite=True))  # the profile now allows it
        cli(ns, config, "token", "revoke", "e2e")  # vm_and_daemon creates it again
        with vm_and_daemon(ns, tap, config, lenient, VM, _disks(nvme, sata)) as env:
            cli(ns, config, "node", "action", HOSTNAME, "retry", env=env)
            serial = lenient / "bmc" / "serial.log"
            _wait_line(serial, "sda: erasing with overwrite", 300, lenient)
            os.kill(_daemon_pid(config), signal.SIGKILL)  # mid-overwrite
            with serving(ns, config, lenient / "daemon-resumed.log") as resumed:
                _wait_api(ns, resumed)
                _wait(ns, config, env, "retired", 120, lenient)
    erased = [r for e, r in first if e == "disk_erased"]
    refused = [r for e, r in first if e == "disk_erase_failed"]
    # the NVMe disk: a Format NVM erase (qemu has no Sanitize), verified; pattern gone
    assert len(erased) == 1 and erased[0].startswith("nvme0n1 (QEMU NVMe Ctrl serial NV-0400)"
                                                     ": erased by nvme-format-"), first
    assert "verified by sampled reads" in erased[0]
    assert PATTERN not in nvme_after_first and nvme_after_first == bytes(NVME_MIB << 20)
    # the SATA disk: no ATA security erase in qemu, no overwrite allowed: the step fails
    assert len(refused) == 1 and refused[0].startswith("sda (QEMU HARDDISK"), first
    assert "overwrite is not allowed" in refused[0]
    assert "sda" in str(failed["last_error"]) and "sanitise failed" in str(failed["last_error"])
    assert sata_after_first == sata_before  # untouched: refused, not half-erased
    # the retry with the overwrite allowed: both disks erased, each by its method
    history = _history(state / "provisioner.sqlite")
    second = history[len(first):]
    methods = {r.split(" ", 1)[0]: r for e, r in second if e == "disk_erased"}
    assert set(methods) == {"nvme0n1", "sda"}, second
    assert "erased by nvme-format-" in methods["nvme0n1"]
    assert "erased by overwrite, verified" in methods["sda"]
    assert not [r for e, r in second if e == "disk_erase_failed"]
    assert sata.read_bytes() == bytes(SATA_MIB << 20)
    # the daemon SIGKILLed during the SATA overwrite: the resumed step queued the same job
    # again (the run id is kept), which the agent either settled with its late report or
    # answered from memory; each disk was erased once in this boot, and recorded once
    console = (lenient / "bmc" / "serial.log").read_text(errors="replace")
    resumed = (lenient / "daemon-resumed.log").read_text(errors="replace")
    assert "sanitising its disks" in resumed, resumed[-3000:]
    assert console.count("nvme0n1: erasing with") == 1 and \
        console.count("sda: erasing with overwrite") == 1, console[-3000:]
    assert len([r for e, r in second if e == "disk_erased"]) == 2, second
