"""The ``sanitise`` job: every disk of the node erased by the strongest method it supports
(``erase.py`` says which), then verified by reading sampled blocks. A disk that refuses every
allowed method, or whose samples still show data, fails the job with the reason; the others
are reported all the same (one result per disk, for the node's history).

Runs in the ramdisk: the tools are ``nvme`` (nvme-cli), ``hdparm`` and ``sg_sanitize``
(sg3-utils), packed by ``provisioner/ramdisk``."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from provisioner.agent import erase

log = logging.getLogger("provisioner.agent")
CHUNK = 4 << 20
SANITIZE_TIMEOUT_S = 24 * 3600.0  # a large drive's sanitize runs in the background for hours
_SKIPPED = ("loop", "ram", "zram", "dm-", "sr", "fd", "md", "nbd")


class Refused(RuntimeError):
    """The drive refused a method (or the ramdisk lacks its tool): the next one is tried."""


def node_disks(sys_block: Path = Path("/sys/block")) -> list[str]:
    """The node's disks: /sys/block less virtual devices and NVMe multipath's hidden paths."""
    return [dev.name for dev in sorted(sys_block.glob("*"))
            if not dev.name.startswith(_SKIPPED)
            and not re.fullmatch(r"nvme\d+c\d+n\d+", dev.name)]


def sanitise(disks: Iterable[str], *, allow_overwrite: bool, device_dir: Path = Path("/dev"),
             on_disk: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Erase and verify each disk; one result per disk: ``device``, ``model``, ``serial``,
    ``method``, ``verified``, ``seconds`` and, when it failed, ``error``."""
    results = []
    for name in disks:
        started = time.monotonic()
        result: dict[str, Any] = {"device": name, "model": "", "serial": "", "method": "",
                                  "verified": False}
        try:
            erase_disk(device_dir / name, result, allow_overwrite=allow_overwrite)
        except (Refused, OSError, ValueError, subprocess.SubprocessError) as exc:
            result["error"] = str(exc)[:500]
            log.error("%s: %s", name, result["error"])
        result["seconds"] = round(time.monotonic() - started, 1)
        results.append(result)
        if on_disk is not None:
            on_disk(result)
    return results


def erase_disk(device: Path, result: dict[str, Any], *, allow_overwrite: bool) -> None:
    """Fill ``result`` for ``device``; raise (Refused, OSError) when it cannot be erased."""
    size = _size(device)
    methods, refusals = _methods(device, result)
    if allow_overwrite:
        methods.append(erase.OVERWRITE)
    before = {offset: erase.digest(block) for offset, block in erase.sample(device, size).items()}
    for method in methods:
        try:
            log.info("%s: erasing with %s", device.name, method)
            _run_method(method, device, size)
        except Refused as exc:
            refusals.append(f"{method}: {exc}")
            log.warning("%s: %s refused: %s", device.name, method, exc)
            continue
        result["method"] = method
        problem = erase.check(method, before, erase.sample(device, size))
        if problem:
            raise Refused(f"{method} did not erase the disk: {problem}")
        result["verified"] = True
        log.info("%s: erased with %s, %d sampled blocks verified", device.name, method,
                 len(erase.offsets(size)))
        return
    allowed = "" if allow_overwrite else " (overwrite is not allowed for this profile)"
    raise Refused(f"no erase method worked{allowed}: " + ("; ".join(refusals) or "none found"))


def _size(device: Path) -> int:
    with open(device, "rb") as disk:
        return disk.seek(0, os.SEEK_END)


def _methods(device: Path, result: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The drive's own methods, strongest first, and why there are no others."""
    if device.name.startswith("nvme"):
        controller = device.parent / re.sub(r"n\d+$", "", device.name)
        caps = erase.nvme_caps(json.loads(_tool("nvme", "id-ctrl", str(controller),
                                                "-o", "json")))
        result.update(model=caps.model, serial=caps.serial, capabilities=caps.describe())
        log.info("%s: nvme id-ctrl %s", device.name, caps.describe())
        methods = caps.methods()
        return methods, [] if methods else [f"the controller offers no erase ({caps.describe()})"]
    vendor = _read(Path("/sys/block") / device.name / "device/vendor")
    result.update(model=_read(Path("/sys/block") / device.name / "device/model"))
    if vendor not in ("", "ATA"):  # SCSI/SAS: only the device's answer tells
        return [erase.SCSI_SANITIZE_CRYPTO, erase.SCSI_SANITIZE_BLOCK], []
    try:
        security = erase.ata_security(_tool("hdparm", "-I", str(device)))
    except Refused as exc:
        return [], [f"hdparm -I: {exc}"]
    result.update(model=security.model or result["model"], serial=security.serial)
    methods = security.methods()
    return methods, [] if methods else [security.refusal()]


def _run_method(method: str, device: Path, size: int) -> None:
    controller = device.parent / re.sub(r"n\d+$", "", device.name)
    if method in (erase.NVME_SANITIZE_CRYPTO, erase.NVME_SANITIZE_BLOCK):
        action = "4" if method == erase.NVME_SANITIZE_CRYPTO else "2"
        _tool("nvme", "sanitize", str(controller), f"--sanact={action}")
        _wait_sanitize(controller)
    elif method in (erase.NVME_FORMAT_CRYPTO, erase.NVME_FORMAT_USER_DATA):
        ses = "2" if method == erase.NVME_FORMAT_CRYPTO else "1"
        _tool("nvme", "format", str(device), f"--ses={ses}", "--force",
              "--timeout=3600000")
    elif method in (erase.ATA_ENHANCED, erase.ATA_SECURE):
        _ata_erase(device, enhanced=method == erase.ATA_ENHANCED)
    elif method in (erase.SCSI_SANITIZE_CRYPTO, erase.SCSI_SANITIZE_BLOCK):
        kind = "--crypto" if method == erase.SCSI_SANITIZE_CRYPTO else "--block"
        _tool("sg_sanitize", kind, "--quick", "--wait", str(device), timeout=SANITIZE_TIMEOUT_S)
    elif method == erase.OVERWRITE:
        _overwrite(device, size)
    else:
        raise Refused(f"unknown method {method}")


def _ata_erase(device: Path, *, enhanced: bool) -> None:
    """hdparm's secure erase needs a user password set first; the erase clears it. When the
    erase fails the password is taken off again, so the drive is not left locked."""
    password = secrets.token_hex(8)
    _tool("hdparm", "--user-master", "u", "--security-set-pass", password, str(device))
    flag = "--security-erase-enhanced" if enhanced else "--security-erase"
    try:
        _tool("hdparm", "--user-master", "u", flag, password, str(device),
              timeout=SANITIZE_TIMEOUT_S)
    except Refused:
        subprocess.run(["hdparm", "--user-master", "u", "--security-disable", password,
                        str(device)], capture_output=True, check=False, timeout=60)
        raise


def _wait_sanitize(controller: Path) -> None:
    """Poll the Sanitize Status log until the operation ends (SSTAT bits 2:0: 1 or 4 done,
    3 failed, 2 in progress)."""
    deadline = time.monotonic() + SANITIZE_TIMEOUT_S
    while time.monotonic() < deadline:
        status = _sanitize_status(json.loads(_tool("nvme", "sanitize-log", str(controller),
                                                   "-o", "json")))
        if status in (1, 4):
            return
        if status == 3:
            raise Refused("the sanitize operation failed (sanitize log SSTAT 3)")
        time.sleep(5)
    raise Refused("the sanitize operation did not end in time")


def _sanitize_status(log_json: Any) -> int:
    """SSTAT's status from nvme-cli's sanitize-log JSON (nested per device in 2.x, an
    integer or an object with ``status``)."""
    if isinstance(log_json, dict):
        if "sstat" in log_json:
            sstat = log_json["sstat"]
            return int(sstat.get("status", 0) if isinstance(sstat, dict) else sstat) & 0x7
        for value in log_json.values():
            if isinstance(value, dict):
                return _sanitize_status(value)
    return 0


def _overwrite(device: Path, size: int) -> None:
    zeros = bytes(CHUNK)
    with open(device, "r+b", buffering=0) as disk:
        written = 0
        while written < size:
            written += disk.write(zeros[:min(CHUNK, size - written)])
        os.fsync(disk.fileno())


def _tool(*cmd: str, timeout: float = 3600.0) -> str:
    if shutil.which(cmd[0]) is None:
        raise Refused(f"this ramdisk has no {cmd[0]}")
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        shown = " ".join(c for c in cmd[:2])
        raise Refused(f"{shown} failed ({proc.returncode}): "
                      f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
