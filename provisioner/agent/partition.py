"""Grows a freshly written image's last partition to the disk's end and adds a small seed
partition after it (for the cloud-init NoCloud seed), on MBR or GPT disks.

An image is made for a small disk; the node's disk is larger. The last partition (by end
sector) ends where the seed partition begins; the filesystem inside is grown by the OS on
first boot (cloud-init's ``growpart``/``resize_rootfs``). On GPT the backup table moves to the
disk's new end and both headers get new CRCs. Standard library only (it runs in the ramdisk).
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import IO

SECTOR = 512
ALIGN = 2048  # 1 MiB, in sectors
_GPT_SIGNATURE = b"EFI PART"
_LINUX_DATA = uuid.UUID("0fc63daf-8483-4772-8e79-3d69d8477de4")
_EXTENDED = {0x05, 0x0F, 0x85}
_MBR_LIMIT = 0xFFFFFFFF


class PartitionError(ValueError):
    """The partition table cannot be grown or extended; the message says why."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What ``grow_and_add_seed`` did: partitions are 1-based, sectors of 512 bytes."""

    table: str
    grown: int
    grown_end: int
    seed: int
    seed_start: int
    seed_sectors: int

    def describe(self) -> str:
        return (f"{self.table}: partition {self.grown} grown to sector {self.grown_end}, "
                f"seed partition {self.seed} at sector {self.seed_start} "
                f"({self.seed_sectors * SECTOR >> 20} MiB)")


def grow_and_add_seed(disk: IO[bytes], seed_bytes: int) -> Layout:
    """Grow the last partition and add a partition of at least ``seed_bytes`` at the end."""
    size = disk.seek(0, os.SEEK_END)
    disk.seek(0)
    mbr = bytearray(disk.read(SECTOR))
    if len(mbr) < SECTOR or mbr[510:512] != b"\x55\xaa":
        raise PartitionError("the image has no partition table (no MBR signature)")
    seed_sectors = -(-seed_bytes // SECTOR // ALIGN) * ALIGN or ALIGN
    if any(mbr[446 + 16 * i + 4] == 0xEE for i in range(4)):
        return _gpt(disk, mbr, size // SECTOR, seed_sectors)
    return _mbr(disk, mbr, size // SECTOR, seed_sectors)


# -- MBR -------------------------------------------------------------------------------------

def _chs(lba: int) -> bytes:
    """CHS for an LBA at 255 heads × 63 sectors; past 1023 cylinders, the "use LBA" marker."""
    cylinder, rest = divmod(lba, 255 * 63)
    if cylinder > 1023:
        return b"\xfe\xff\xff"
    head, sector = divmod(rest, 63)
    return bytes((head, ((cylinder >> 2) & 0xC0) | (sector + 1), cylinder & 0xFF))


def _mbr(disk: IO[bytes], mbr: bytearray, sectors: int, seed_sectors: int) -> Layout:
    sectors = min(sectors, _MBR_LIMIT + 1)
    entries = [struct.unpack_from("<B3sB3sII", mbr, 446 + 16 * i) for i in range(4)]
    used = [i for i, e in enumerate(entries) if e[2] != 0 and e[5] != 0]
    if not used:
        raise PartitionError("the MBR has no partitions")
    last = max(used, key=lambda i: entries[i][4] + entries[i][5])
    if entries[last][2] in _EXTENDED:
        raise PartitionError("the last partition is an extended partition: logical "
                             "partitions cannot be grown here")
    free = [i for i in range(4) if i not in used]
    if not free:
        raise PartitionError("all four MBR partition slots are used: no room for the seed")
    seed_start = (sectors - seed_sectors) // ALIGN * ALIGN
    start = entries[last][4]
    end = max(start + entries[last][5] - 1, seed_start - 1)
    if end >= seed_start:
        raise PartitionError(f"the disk ({sectors * SECTOR} bytes) is too small for the "
                             "image plus the seed partition")
    _mbr_entry(mbr, last, entries[last][0], entries[last][2], start, end - start + 1)
    _mbr_entry(mbr, free[0], 0, 0x83, seed_start, seed_sectors)
    disk.seek(0)
    disk.write(mbr)
    return Layout("mbr", last + 1, end, free[0] + 1, seed_start, seed_sectors)


def _mbr_entry(mbr: bytearray, index: int, status: int, kind: int, start: int,
               count: int) -> None:
    struct.pack_into("<B3sB3sII", mbr, 446 + 16 * index, status, _chs(start), kind,
                     _chs(start + count - 1), start, count)


# -- GPT -------------------------------------------------------------------------------------

@dataclass
class _Gpt:
    header: bytearray
    entries: bytearray
    count: int
    entry_size: int

    @property
    def entry_sectors(self) -> int:
        return -(-self.count * self.entry_size // SECTOR)


def _read_gpt(disk: IO[bytes]) -> _Gpt:
    disk.seek(SECTOR)
    header = bytearray(disk.read(SECTOR))
    if header[:8] != _GPT_SIGNATURE:
        raise PartitionError("protective MBR but no GPT header at sector 1")
    size = struct.unpack_from("<I", header, 12)[0]
    if not 92 <= size <= SECTOR:
        raise PartitionError(f"GPT header size {size} is invalid")
    stored = struct.unpack_from("<I", header, 16)[0]
    if zlib.crc32(header[:16] + b"\0\0\0\0" + header[20:size]) != stored:
        raise PartitionError("the primary GPT header's CRC is wrong: the image is damaged")
    entries_lba, count, entry_size, entries_crc = struct.unpack_from("<QIII", header, 72)
    if entry_size < 128 or entry_size % 8 or not 0 < count <= 1024:
        raise PartitionError(f"GPT entry array ({count} × {entry_size}) is invalid")
    disk.seek(entries_lba * SECTOR)
    entries = bytearray(disk.read(count * entry_size))
    if zlib.crc32(entries) != entries_crc:
        raise PartitionError("the GPT partition entries' CRC is wrong: the image is damaged")
    return _Gpt(header[:size], entries, count, entry_size)


def _gpt(disk: IO[bytes], mbr: bytearray, sectors: int, seed_sectors: int) -> Layout:
    gpt = _read_gpt(disk)
    old_backup = struct.unpack_from("<Q", gpt.header, 32)[0]
    last_lba = sectors - 1
    last_usable = last_lba - gpt.entry_sectors - 1
    parts = [(i, *struct.unpack_from("<QQ", gpt.entries, i * gpt.entry_size + 32))
             for i in range(gpt.count) if any(gpt.entries[i * gpt.entry_size:][:16])]
    if not parts:
        raise PartitionError("the GPT has no partitions")
    free = [i for i in range(gpt.count) if i not in {p[0] for p in parts}]
    if not free:
        raise PartitionError("the GPT has no free entry for the seed partition")
    last, start, end = max(parts, key=lambda p: p[2])
    seed_start = (last_usable + 1 - seed_sectors) // ALIGN * ALIGN
    if end >= seed_start:
        raise PartitionError(f"the disk ({sectors * SECTOR} bytes) is too small for the "
                             "image plus the seed partition")
    struct.pack_into("<Q", gpt.entries, last * gpt.entry_size + 40, seed_start - 1)
    name = "cidata".encode("utf-16-le").ljust(72, b"\0")
    struct.pack_into("<16s16sQQQ72s", gpt.entries, free[0] * gpt.entry_size,
                     _LINUX_DATA.bytes_le, uuid.uuid4().bytes_le, seed_start,
                     seed_start + seed_sectors - 1, 0, name)
    _write_gpt(disk, gpt, last_lba, last_usable, old_backup)
    struct.pack_into("<I", mbr, 446 + 12, min(last_lba, _MBR_LIMIT))  # protective MBR size
    mbr[446 + 5:446 + 8] = _chs(last_lba)
    disk.seek(0)
    disk.write(mbr)
    return Layout("gpt", last + 1, seed_start - 1, free[0] + 1, seed_start, seed_sectors)


def _write_gpt(disk: IO[bytes], gpt: _Gpt, last_lba: int, last_usable: int,
               old_backup: int) -> None:
    entries_crc = zlib.crc32(gpt.entries)
    backup_entries = last_lba - gpt.entry_sectors
    primary = _gpt_header(gpt.header, 1, last_lba, last_usable,
                          struct.unpack_from("<Q", gpt.header, 72)[0], entries_crc)
    backup = _gpt_header(gpt.header, last_lba, 1, last_usable, backup_entries, entries_crc)
    if 1 < old_backup < last_lba:
        disk.seek(old_backup * SECTOR)  # the image's old backup header: now inside a
        disk.write(bytes(SECTOR))       # partition, and stale
    for lba, data in ((backup_entries, gpt.entries), (last_lba, backup),
                      (struct.unpack_from("<Q", primary, 72)[0], gpt.entries), (1, primary)):
        disk.seek(lba * SECTOR)
        disk.write(data)


def _gpt_header(template: bytearray, mine: int, alternate: int, last_usable: int,
                entries_lba: int, entries_crc: int) -> bytes:
    header = bytearray(template)
    struct.pack_into("<QQ", header, 24, mine, alternate)
    struct.pack_into("<Q", header, 48, last_usable)
    struct.pack_into("<Q", header, 72, entries_lba)
    struct.pack_into("<I", header, 88, entries_crc)
    struct.pack_into("<I", header, 16, 0)
    struct.pack_into("<I", header, 16, zlib.crc32(header))
    return bytes(header).ljust(SECTOR, b"\0")
