"""The sanitise job's method choice from drives' real answers (tests/fixtures/sanitise), its
verification by sampled reads, and the erase of a disk that offers no method of its own
(a file: ``hdparm -I`` refuses it as it refuses qemu's emulated SATA disk)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from provisioner.agent import erase
from provisioner.agent.__main__ import _job
from provisioner.agent.sanitise import Refused, erase_disk, node_disks, sanitise
from provisioner.domain import DiskErasure, Sanitised
from provisioner.lifecycle.erasure import erased_disks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sanitise"
MIB = 1 << 20


def _id_ctrl(**edits: int) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / "nvme-id-ctrl-wdc-sn730.json").read_text())
    return loaded | edits


def test_nvme_with_sanitize_and_crypto_format_gets_sanitize_crypto_first() -> None:
    caps = erase.nvme_caps(_id_ctrl())
    assert caps.methods() == [erase.NVME_SANITIZE_CRYPTO, erase.NVME_SANITIZE_BLOCK,
                              erase.NVME_FORMAT_CRYPTO, erase.NVME_FORMAT_USER_DATA]
    assert (caps.serial, caps.model) == ("1951B3444502", "WDC PC SN730 SDBQNTY-256G-1001")
    assert caps.describe() == "sanicap 0x60000003, oacs 0x17, fna 0x4"


def test_nvme_without_sanitize_falls_to_format_crypto_then_user_data() -> None:
    # IPA's own edits of the same capture: no Sanitize, then no crypto erase in Format
    assert erase.nvme_caps(_id_ctrl(sanicap=0)).methods() == [
        erase.NVME_FORMAT_CRYPTO, erase.NVME_FORMAT_USER_DATA]
    assert erase.nvme_caps(_id_ctrl(sanicap=0, fna=0)).methods() == [
        erase.NVME_FORMAT_USER_DATA]
    assert erase.nvme_caps(_id_ctrl(sanicap=0, oacs=0)).methods() == []
    # block erase only (SANICAP bit 1), Format still there
    assert erase.nvme_caps(_id_ctrl(sanicap=2, fna=0)).methods() == [
        erase.NVME_SANITIZE_BLOCK, erase.NVME_FORMAT_USER_DATA]


def test_qemus_emulated_controller_gets_a_user_data_format() -> None:
    """qemu 7.2's NVMe controller, as the agent logged it in tests/e2e/test_sanitise_qemu.py:
    no Sanitize, Format NVM (OACS bit 1, with namespace management and doorbell buffer
    config), no crypto erase in Format."""
    caps = erase.nvme_caps({"sanicap": 0, "oacs": 0x10a, "fna": 0, "sn": "NV-0400",
                            "mn": "QEMU NVMe Ctrl"})
    assert caps.methods() == [erase.NVME_FORMAT_USER_DATA]


def test_ata_drive_with_security_but_no_enhanced_erase_gets_secure_erase() -> None:
    security = erase.ata_security((FIXTURES / "hdparm-I-sata-fdm-ipa.txt").read_text())
    assert (security.supported, security.enabled, security.locked, security.frozen,
            security.enhanced) == (True, False, False, False, False)
    assert security.methods() == [erase.ATA_SECURE]
    assert (security.model, security.serial) == ("7 PIN  SATA FDM", "20131210000000000023")
    assert security.refusal() == ""


def test_frozen_ata_drive_offers_nothing_and_says_why() -> None:
    security = erase.ata_security(
        (FIXTURES / "hdparm-I-security-frozen-tinyapps.txt").read_text())
    assert security.supported and security.frozen and security.enhanced
    assert security.methods() == []
    assert "frozen" in security.refusal()


def test_enhanced_erase_comes_before_secure_erase() -> None:
    security = erase.ata_security(
        (FIXTURES / "hdparm-I-security-enabled-tinyapps.txt").read_text())
    assert security.enabled and not security.frozen and not security.locked
    assert security.methods() == [erase.ATA_ENHANCED, erase.ATA_SECURE]


def test_a_drive_without_a_security_section_supports_no_secure_erase() -> None:
    text = (FIXTURES / "hdparm-I-sata-fdm-ipa.txt").read_text().split("\nSecurity:")[0]
    security = erase.ata_security(text)
    assert not security.supported and security.methods() == []
    assert "not supported" in security.refusal()


def test_samples_are_64_blocks_spread_from_first_to_last() -> None:
    where = erase.offsets(96 * MIB)
    assert len(where) == 64 and where[0] == 0 and where[-1] == 96 * MIB - erase.BLOCK
    assert all(offset % erase.BLOCK == 0 for offset in where)
    assert erase.offsets(erase.BLOCK) == [0]


def _patterned(path: Path, size: int) -> bytes:
    pattern = (b"TENANT-DATA-" * 400)[:erase.BLOCK]
    path.write_bytes(pattern * (size // erase.BLOCK))
    return pattern


def test_verification_tells_erased_from_unerased(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    _patterned(disk, 4 * MIB)
    before = {o: erase.digest(b) for o, b in erase.sample(disk, 4 * MIB).items()}
    untouched = erase.sample(disk, 4 * MIB)
    assert "64 of 64 sampled blocks not blank" in erase.check(erase.OVERWRITE, before,
                                                              untouched)
    assert "unchanged since before the erase" in erase.check(erase.NVME_FORMAT_CRYPTO,
                                                             before, untouched)
    disk.write_bytes(os.urandom(4 * MIB))  # what a crypto erase leaves: noise
    assert erase.check(erase.NVME_FORMAT_CRYPTO, before, erase.sample(disk, 4 * MIB)) == ""
    assert erase.check(erase.NVME_FORMAT_USER_DATA, before, erase.sample(disk, 4 * MIB))
    disk.write_bytes(b"\xff" * 4 * MIB)  # a drive's own erase may read 0xFF (NVMe DLFEAT)
    assert erase.check(erase.NVME_FORMAT_USER_DATA, before, erase.sample(disk, 4 * MIB)) == ""
    assert erase.check(erase.OVERWRITE, before, erase.sample(disk, 4 * MIB))  # zeros only


def test_a_disk_with_no_method_of_its_own_fails_unless_overwrite_is_allowed(
        tmp_path: Path) -> None:
    disk = tmp_path / "sdz"
    pattern = _patterned(disk, 8 * MIB)
    refused: dict[str, Any] = {"model": ""}
    with pytest.raises(Refused, match="overwrite is not allowed"):
        erase_disk(disk, refused, allow_overwrite=False)
    assert disk.read_bytes().count(pattern) == 8 * MIB // erase.BLOCK  # untouched
    results = sanitise(["sdz"], allow_overwrite=True, device_dir=tmp_path)
    assert [(r["device"], r["method"], r["verified"]) for r in results] == [
        ("sdz", erase.OVERWRITE, True)]
    assert "error" not in results[0] and results[0]["seconds"] >= 0
    assert disk.read_bytes() == bytes(8 * MIB)


def test_a_failed_disk_is_reported_with_its_reason(tmp_path: Path) -> None:
    _patterned(tmp_path / "sdy", 1 * MIB)
    (result,) = sanitise(["sdy"], allow_overwrite=False, device_dir=tmp_path)
    assert result["verified"] is False and "no erase method worked" in result["error"]
    row = DiskErasure.from_report(result)
    assert not row.ok and row.describe().startswith("sdy: not erased: no erase method worked")


def test_a_repeated_job_is_answered_from_memory_never_run_again(tmp_path: Path) -> None:
    """The daemon restarted mid-erase asks again with the same generation: the agent
    answers what it did (a failure stays a failure) and touches no disk."""
    done: dict[str, dict[str, Any]] = {
        "sanitise:r1": {"ok": True, "disks": [{"device": "nvme0n1", "method": "x",
                                               "verified": True}]},
        "sanitise:r2": {"ok": False, "error": "sda: no erase method worked", "disks": []}}
    client: Any = None  # never called: a repeated job goes nowhere
    again = _job(client, {"command": "sanitise", "generation": "sanitise:r1"}, done, tmp_path)
    assert again["ok"] is True and again["note"] == "already done"
    assert again["disks"][0]["device"] == "nvme0n1"
    failed = _job(client, {"command": "sanitise", "generation": "sanitise:r2"}, done, tmp_path)
    assert failed["ok"] is False and "no erase method" in failed["error"]


def test_the_daemon_reads_the_agents_report_and_its_checkpoint() -> None:
    report = {"ok": False, "error": "sda: refused", "disks": [
        {"device": "nvme0n1", "model": "QEMU NVMe Ctrl", "serial": "NV-1",
         "method": erase.NVME_FORMAT_USER_DATA, "verified": True, "seconds": 1.25},
        {"device": "sda", "method": "", "verified": False, "error": "refused"}]}
    outcome = Sanitised.from_report(report)
    assert outcome.error == "sda: refused"
    assert [d.ok for d in outcome.disks] == [True, False]
    assert outcome.disks[0].describe() == (
        "nvme0n1 (QEMU NVMe Ctrl serial NV-1): erased by nvme-format-user-data, verified by "
        "sampled reads, 1.2 s")
    assert erased_disks(["power-on", "erased:nvme0n1", "erased:sdb"]) == {"nvme0n1", "sdb"}


def test_virtual_devices_are_not_disks(tmp_path: Path) -> None:
    for name in ("loop0", "ram0", "sr0", "dm-0", "md0", "nvme0c0n1", "nvme0n1", "sda", "vda"):
        (tmp_path / name).mkdir()
    assert node_disks(tmp_path) == ["nvme0n1", "sda", "vda"]
