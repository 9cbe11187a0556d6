"""Converts a qcow2 image to raw as it streams in, onto a disk, in one forward pass.

qcow2 is not streamable in general: a data cluster's guest offset is in an L2 table that may
sit anywhere in the file. Images written by ``qemu-img convert`` (and by a running VM, except
after a resize) place each L2 table before the clusters it maps, so a single pass places
nearly everything at once; a data cluster that arrives before its table is kept in RAM
(bounded, ``max_deferred``) until the table shows up, and zero clusters are never kept.
Guest ranges no cluster wrote (unallocated, zero flag, all-zero data) are zeroed at the end
with ``BLKZEROOUT`` on a block device, so an earlier install never shows through.

Supported: versions 2 and 3, any cluster size, no backing file, no encryption, no compressed
clusters, no external data file, no extended L2 entries; each is refused with the reason.
Standard library only (it runs in the ramdisk).
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from typing import IO

MAGIC = b"QFI\xfb"
_OFFSET_MASK = 0x00FF_FFFF_FFFF_FE00
_COMPRESSED = 1 << 62
_ZERO_FLAG = 1
_BLKZEROOUT = 0x127F
_ZEROS = bytes(1 << 20)
# incompatible feature bits: 0 dirty (harmless for reading), 3 compression type (only
# matters for compressed clusters, refused anyway)
_INCOMPATIBLE = {1: "marked corrupt", 2: "an external data file", 4: "extended L2 entries"}


class Qcow2Error(ValueError):
    """The image is not a qcow2 this reader can convert; the message says why."""


class Qcow2Writer:
    """``feed`` the file's bytes in order, then ``finish``; writes guest data to ``disk``."""

    def __init__(self, disk: IO[bytes], disk_size: int, *, max_deferred: int = 256 << 20) -> None:
        self._disk = disk
        self._disk_size = disk_size
        self._max_deferred = max_deferred
        self._buf = bytearray()
        self._pos = 0  # host offset of _buf[0]; always cluster-aligned after the header
        self._cluster = 0
        self.virtual_size = 0
        self._l1 = (0, 0)  # host offset, byte length
        self._l1_bytes = bytearray()
        self._l2_pending: dict[int, int] = {}  # host offset -> L1 index
        self._runs: dict[int, list[tuple[int, int]]] = {}  # host cluster -> (guest cl, n)
        self._active: list[list[int]] = []  # [guest cluster, remaining]
        self._deferred: dict[int, bytes] = {}  # host cluster -> data (table not seen yet)
        self._deferred_bytes = 0
        self._written: list[tuple[int, int]] = []  # guest (cluster, count) with data

    # -- input ----------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        self._buf += data
        if not self._cluster:
            if len(self._buf) < 104:
                return
            self._header(bytes(self._buf[:104]))
        while len(self._buf) >= self._cluster:
            self._step()

    def finish(self) -> int:
        """Flush the tail and zero what no cluster wrote; returns the virtual size."""
        if not self._cluster:
            raise Qcow2Error("not a qcow2 image: the file is shorter than its header")
        if self._buf:
            self._buf += bytes(self._cluster - len(self._buf))
            self._step()
        if len(self._l1_bytes) < self._l1[1]:
            raise Qcow2Error("truncated qcow2 image: the L1 table is past its end")
        if self._l2_pending:
            raise Qcow2Error(f"truncated qcow2 image: {len(self._l2_pending)} L2 tables "
                             "are past its end")
        self._zero_gaps()
        return self.virtual_size

    # -- parsing --------------------------------------------------------------------------

    def _header(self, head: bytes) -> None:
        (magic, version, backing_offset, _backing_size, cluster_bits, size, crypt, l1_size,
         l1_offset) = struct.unpack_from(">4sIQIIQIIQ", head)
        if magic != MAGIC:
            raise Qcow2Error("not a qcow2 image (bad magic)")
        if version not in (2, 3):
            raise Qcow2Error(f"qcow2 version {version} is not supported (2 or 3)")
        if backing_offset:
            raise Qcow2Error("qcow2 images with a backing file are not supported: "
                             "flatten it with `qemu-img convert -O qcow2`")
        if crypt:
            raise Qcow2Error("encrypted qcow2 images are not supported")
        if not 9 <= cluster_bits <= 21:
            raise Qcow2Error(f"qcow2 cluster_bits {cluster_bits} is out of range")
        if version == 3:
            incompatible = struct.unpack_from(">Q", head, 72)[0]
            for bit, what in _INCOMPATIBLE.items():
                if incompatible & (1 << bit):
                    raise Qcow2Error(f"qcow2 images with {what} are not supported")
            if incompatible & ~0b11111:
                raise Qcow2Error(f"unknown qcow2 incompatible features {incompatible:#x}")
        self._cluster = 1 << cluster_bits
        per_l2 = self._cluster // 8
        if l1_size * per_l2 * self._cluster < size or l1_offset % self._cluster:
            raise Qcow2Error("corrupt qcow2 header: the L1 table does not cover the disk")
        if size > self._disk_size:
            raise Qcow2Error(f"the image's disk is {size} bytes; the target has only "
                             f"{self._disk_size}")
        self.virtual_size = size
        self._l1 = (l1_offset, l1_size * 8)

    def _step(self) -> None:
        """Handle the cluster at ``_pos`` (a run of data clusters at once)."""
        size, host = self._cluster, self._pos // self._cluster
        count = 1
        l1_offset, l1_len = self._l1
        if l1_offset <= self._pos < l1_offset + l1_len:
            take = min(size, l1_offset + l1_len - self._pos)
            self._l1_bytes += self._buf[:take]
            if len(self._l1_bytes) == l1_len:
                self._parse_l1()
        elif self._pos in self._l2_pending:
            self._parse_l2(self._l2_pending.pop(self._pos), bytes(self._buf[:size]))
        elif self._runs.get(host) or self._active:
            self._active += [[guest, n] for guest, n in self._runs.pop(host, [])]
            count = min(min(n for _, n in self._active), len(self._buf) // size)
            for run in self._active:
                self._place(run[0], bytes(self._buf[:count * size]))
                run[0] += count
                run[1] -= count
            self._active = [run for run in self._active if run[1] > 0]
        elif host and (self._l2_pending or len(self._l1_bytes) < l1_len):
            self._defer(host, bytes(self._buf[:size]))
        del self._buf[:count * size]
        self._pos += count * size

    def _parse_l1(self) -> None:
        table = struct.unpack(f">{len(self._l1_bytes) // 8}Q", self._l1_bytes)
        for index, entry in enumerate(table):
            offset = entry & _OFFSET_MASK
            if not offset:
                continue
            if offset % self._cluster:
                raise Qcow2Error(f"corrupt qcow2: L2 table {index} at unaligned {offset:#x}")
            passed = self._deferred.pop(offset // self._cluster, None)
            if offset < self._pos:  # behind us: from RAM, or it was all zeros
                if passed is not None:
                    self._deferred_bytes -= len(passed)
                    self._parse_l2(index, passed)
            else:
                self._l2_pending[offset] = index

    def _parse_l2(self, l1_index: int, table: bytes) -> None:
        per_l2 = self._cluster // 8
        first_guest = l1_index * per_l2
        run_host = run_guest = run_len = 0
        for i, entry in enumerate(struct.unpack(f">{per_l2}Q", table)):
            guest = first_guest + i
            if guest * self._cluster >= self.virtual_size:
                break
            if entry & _COMPRESSED:
                raise Qcow2Error("compressed qcow2 clusters are not supported: rewrite it "
                                 "with `qemu-img convert -O qcow2` (without -c)")
            offset = entry & _OFFSET_MASK
            if entry & _ZERO_FLAG or not offset:
                continue  # reads as zeros: the gap pass zeroes it
            if offset % self._cluster:
                raise Qcow2Error(f"corrupt qcow2: cluster at unaligned offset {offset:#x}")
            host = offset // self._cluster
            if run_len and host == run_host + run_len and guest == run_guest + run_len:
                run_len += 1
                continue
            if run_len:
                self._add_run(run_host, run_guest, run_len)
            run_host, run_guest, run_len = host, guest, 1
        if run_len:
            self._add_run(run_host, run_guest, run_len)

    def _add_run(self, host: int, guest: int, count: int) -> None:
        here = self._pos // self._cluster + 1  # the cluster being handled is a table
        for behind in range(host, min(host + count, here)):  # data that came first
            data = self._deferred.pop(behind, None)
            if data is not None:
                self._deferred_bytes -= len(data)
                self._place(guest + behind - host, data)
        if host + count > here:
            start = max(host, here)
            self._runs.setdefault(start, []).append((guest + start - host,
                                                     host + count - start))

    def _defer(self, host: int, data: bytes) -> None:
        if not any(data):
            return  # if it turns out to be data, the gap pass zeroes it anyway
        self._deferred_bytes += len(data)
        if self._deferred_bytes > self._max_deferred:
            raise Qcow2Error(
                f"this qcow2 image stores more than {self._max_deferred >> 20} MiB of data "
                "before the tables that place it (grown or edited in place); rewrite it "
                "with `qemu-img convert -O qcow2` to deploy it")
        self._deferred[host] = data

    # -- output ---------------------------------------------------------------------------

    def _place(self, guest: int, data: bytes) -> None:
        """Write clusters at guest cluster ``guest``; all-zero ones are left to the gap
        pass. Consecutive non-zero clusters go out in one write."""
        size = self._cluster
        data = data[:max(0, self.virtual_size - guest * size)]
        span = 0  # clusters in the pending span
        clusters = (len(data) + size - 1) // size
        for index in range(clusters + 1):
            if index < clusters and any(data[index * size:(index + 1) * size]):
                span += 1
                continue
            if span:
                first = index - span
                self._disk.seek((guest + first) * size)
                self._disk.write(data[first * size:index * size])
                self._mark(guest + first, span)
                span = 0

    def _mark(self, cluster: int, count: int) -> None:
        if self._written and sum(self._written[-1]) == cluster:
            self._written[-1] = (self._written[-1][0], self._written[-1][1] + count)
        else:
            self._written.append((cluster, count))

    def _zero_gaps(self) -> None:
        self._disk.flush()
        at = 0
        for cluster, count in sorted(self._written):
            start = cluster * self._cluster
            if start > at:
                zero_range(self._disk, at, start - at)
            at = max(at, start + count * self._cluster)
        if at < self.virtual_size:
            zero_range(self._disk, at, self.virtual_size - at)


def zero_range(disk: IO[bytes], offset: int, length: int) -> None:
    """Zero ``length`` bytes: ``BLKZEROOUT`` on a block device (no data through the page
    cache; the device may unmap), else written zeros."""
    disk.flush()
    if stat.S_ISBLK(os.fstat(disk.fileno()).st_mode):
        try:
            fcntl.ioctl(disk.fileno(), _BLKZEROOUT, struct.pack("QQ", offset, length))
            return
        except OSError:
            pass  # fall back to writing zeros
    disk.seek(offset)
    while length > 0:
        step = min(length, len(_ZEROS))
        disk.write(_ZEROS[:step])
        length -= step
