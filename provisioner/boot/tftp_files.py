"""What TFTP may read: the jail (a name to an open regular file under the root) and the
in-memory copies of file contents that concurrent transfers share.

Whichever process serves a request (the daemon's, or a worker's: ``tftp_service.py``)
resolves and opens the file here (``open_jailed``), and reads it through its own cache.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path

from provisioner.boot.tftp_packets import E_ACCESS, E_NOT_FOUND, TftpError


def jail(root: Path, name: str) -> Path:
    """The file ``name`` under ``root`` (already resolved), or TftpError. Refused: absolute
    paths, ``..`` components (``\\`` counts as ``/``), what resolves outside the root
    (symlinks included)."""
    name = name.replace("\\", "/")
    if name.startswith("/"):
        raise TftpError(E_ACCESS, "absolute paths are refused")
    if ".." in name.split("/"):
        raise TftpError(E_ACCESS, "'..' is refused")
    try:
        target = (root / name).resolve(strict=True)
    except FileNotFoundError:
        raise TftpError(E_NOT_FOUND, "file not found") from None
    except (OSError, RuntimeError):
        raise TftpError(E_ACCESS, "cannot resolve the file name") from None
    if not target.is_relative_to(root):
        raise TftpError(E_ACCESS, "outside the TFTP root")
    return target


def open_jailed(root: Path, name: str) -> int:
    """A read-only descriptor of the regular file ``name`` under ``root``; TftpError for
    what the jail refuses and for what is not a regular file (devices, FIFOs, directories);
    OSError when it cannot be opened. Blocking (a few syscalls)."""
    path = jail(root, name)
    # O_NONBLOCK: a FIFO never blocks the open; O_NOFOLLOW: no link swapped in since
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TftpError(E_ACCESS, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


class FileCache:
    """File contents by (device, inode, size, mtime): one copy for concurrent transfers. A
    file the daemon replaces (a new inode) or rewrites (a new mtime) is read afresh."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._entries: OrderedDict[tuple[int, int, int, int], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def load_fd(self, fd: int) -> bytes:
        """The contents of the regular file open as ``fd``, which this closes. Blocking."""
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise TftpError(E_ACCESS, "not a regular file")
            key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            with self._lock:
                if (hit := self._entries.get(key)) is not None:
                    self._entries.move_to_end(key)
                    return hit
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read()
        finally:
            os.close(fd)
        self._remember(key, data)
        return data

    def _remember(self, key: tuple[int, int, int, int], data: bytes) -> None:
        if len(data) > self._max // 4:
            return
        with self._lock:
            if key not in self._entries:
                self._entries[key] = data
                self._size += len(data)
            while self._size > self._max:
                _, old = self._entries.popitem(last=False)
                self._size -= len(old)
