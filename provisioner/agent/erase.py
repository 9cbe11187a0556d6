"""What a disk can be erased with, read from the drive's own answers, and how an erase is
verified. Pure: no I/O but the sampled reads of ``sample``/``check``.

Methods, strongest first (a disk gets the first one it supports; one it refuses is followed
by the next):

* NVMe, from ``nvme id-ctrl -o json``: ``SANICAP`` bit 0 (crypto erase) and bit 1 (block
  erase) give the Sanitize command's actions; ``OACS`` bit 1 says Format NVM is supported,
  and ``FNA`` bit 2 that its secure erase can be a cryptographic erase (``--ses=2``); else a
  user-data erase (``--ses=1``).
* ATA, from ``hdparm -I``'s ``Security:`` section: the security feature set supported, the
  drive neither locked nor frozen; enhanced secure erase where it says ``supported:
  enhanced erase``, else secure erase.
* SCSI/SAS: ``sg_sanitize`` crypto, then block erase (the device's answer says whether it
  has them: there is nothing to read first).
* ``overwrite``: zeros over the whole device, only where the configuration allows it.

Verification samples ``SAMPLES`` blocks spread over the device before and after: after a
cryptographic erase every sample must read blank or differ from its hash before; after any
other method it must read blank (all 0x00; 0xFF is allowed for a drive's own erase, which
NVMe's DLFEAT lets a controller return for deallocated blocks).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

SAMPLES: Final = 64
BLOCK: Final = 4096

NVME_SANITIZE_CRYPTO: Final = "nvme-sanitize-crypto"
NVME_SANITIZE_BLOCK: Final = "nvme-sanitize-block"
NVME_FORMAT_CRYPTO: Final = "nvme-format-crypto"
NVME_FORMAT_USER_DATA: Final = "nvme-format-user-data"
ATA_ENHANCED: Final = "ata-enhanced-secure-erase"
ATA_SECURE: Final = "ata-secure-erase"
SCSI_SANITIZE_CRYPTO: Final = "scsi-sanitize-crypto"
SCSI_SANITIZE_BLOCK: Final = "scsi-sanitize-block"
OVERWRITE: Final = "overwrite"

#: methods after which the old data reads as noise, not as blank blocks
CRYPTO: Final = frozenset({NVME_SANITIZE_CRYPTO, NVME_FORMAT_CRYPTO, SCSI_SANITIZE_CRYPTO})


@dataclass(frozen=True, slots=True)
class NvmeCaps:
    sanicap: int
    oacs: int
    fna: int
    serial: str
    model: str

    def methods(self) -> list[str]:
        found = []
        if self.sanicap & 0x1:
            found.append(NVME_SANITIZE_CRYPTO)
        if self.sanicap & 0x2:
            found.append(NVME_SANITIZE_BLOCK)
        if self.oacs & 0x2:
            if self.fna & 0x4:
                found.append(NVME_FORMAT_CRYPTO)
            found.append(NVME_FORMAT_USER_DATA)
        return found

    def describe(self) -> str:
        return f"sanicap 0x{self.sanicap:x}, oacs 0x{self.oacs:x}, fna 0x{self.fna:x}"


def nvme_caps(id_ctrl: Mapping[str, Any]) -> NvmeCaps:
    """From ``nvme id-ctrl -o json`` (nvme-cli 1.x and 2.x print the same flat fields)."""
    def number(key: str) -> int:
        value = id_ctrl.get(key, 0)
        return int(value, 0) if isinstance(value, str) else int(value or 0)

    return NvmeCaps(number("sanicap"), number("oacs"), number("fna"),
                    str(id_ctrl.get("sn", "")).strip(), str(id_ctrl.get("mn", "")).strip())


@dataclass(frozen=True, slots=True)
class AtaSecurity:
    supported: bool
    enabled: bool
    locked: bool
    frozen: bool
    enhanced: bool
    serial: str
    model: str

    def methods(self) -> list[str]:
        if not self.supported or self.locked or self.frozen:
            return []
        return [ATA_ENHANCED, ATA_SECURE] if self.enhanced else [ATA_SECURE]

    def refusal(self) -> str:
        """Why the drive offers no secure erase ("" when it offers one)."""
        if not self.supported:
            return "the ATA security feature set is not supported"
        if self.frozen:
            return "the drive's security is frozen (the firmware froze it at boot)"
        if self.locked:
            return "the drive is locked with a password we do not know"
        return ""


def ata_security(hdparm_i: str) -> AtaSecurity:
    """From ``hdparm -I``. A drive without a ``Security:`` section (an emulated or a USB
    one) supports no security feature set. Each state line reads ``\\t\\tsupported`` or
    ``\\tnot\\tsupported``: the word before the tab says no."""
    head, _, section = hdparm_i.partition("\nSecurity:")
    section = re.split(r"\n\S", section, maxsplit=1)[0]  # up to the next heading

    def state(word: str) -> bool:
        match = re.search(rf"^\s*(not)?\s*{word}\s*$", section, re.M)
        return match is not None and match.group(1) is None

    enhanced = re.search(r"^\s*(not)?\s*supported: enhanced erase", section, re.M)
    return AtaSecurity(
        supported=bool(section) and state("supported"), enabled=state("enabled"),
        locked=state("locked"), frozen=state("frozen"),
        enhanced=enhanced is not None and enhanced.group(1) is None,
        serial=_field(head, "Serial Number"), model=_field(head, "Model Number"))


def _field(text: str, name: str) -> str:
    match = re.search(rf"^\s*{name}:\s*(.*?)\s*$", text, re.M)
    return match.group(1) if match else ""


def offsets(size: int, count: int = SAMPLES, block: int = BLOCK) -> list[int]:
    """``count`` block-aligned offsets spread evenly from the first block to the last."""
    last = max(0, size // block - 1)
    if last == 0:
        return [0]
    return sorted({round(i * last / (count - 1)) * block for i in range(count)})


def sample(device: Path, size: int) -> dict[int, bytes]:
    """The blocks at ``offsets(size)``, read past the page cache (``O_DIRECT`` where the
    device allows it): what a drive's erase did must not be hidden by what we read before."""
    return {offset: block for offset, block in _read_blocks(device, offsets(size))}


def _read_blocks(device: Path, where: list[int]) -> list[tuple[int, bytes]]:
    try:
        fd = os.open(device, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        direct = True
    except OSError:  # tmpfs and friends refuse O_DIRECT
        fd, direct = os.open(device, os.O_RDONLY), False
    try:
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buffer = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
        out = []
        for offset in where:
            got = os.preadv(fd, [buffer], offset)
            out.append((offset, bytes(buffer[:got])))
        return out
    finally:
        os.close(fd)


def digest(block: bytes) -> str:
    return hashlib.sha256(block).hexdigest()


def blank(block: bytes, *, drive_erase: bool) -> bool:
    return block.count(0) == len(block) or (drive_erase and block.count(0xFF) == len(block))


def check(method: str, before: Mapping[int, str], after: Mapping[int, bytes]) -> str:
    """"" when ``after`` (the blocks read again) shows ``method`` erased the disk; else
    what does not (the first offending offset and how many samples failed)."""
    crypto = method in CRYPTO
    bad = [offset for offset, block in sorted(after.items())
           if not blank(block, drive_erase=method != OVERWRITE)
           and (not crypto or before.get(offset) == digest(block))]
    if not bad:
        return ""
    what = "unchanged since before the erase" if crypto else "not blank"
    return f"{len(bad)} of {len(after)} sampled blocks {what} (first at byte {bad[0]})"
