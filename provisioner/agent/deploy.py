"""Writes an OS image to a disk as it downloads: no full copy in RAM or on tmpfs.

The sha256 covers the file as served (compressed or not). When it does not match, the
first and last MiB of the disk (partition tables, boot code, the GPT backup) are zeroed,
so firmware never boots a half-written or wrong image. Standard library only (``zstd`` is
used as a pipe when an image needs it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

CHUNK = 4 << 20
BOOT_AREA = 1 << 20


class DeployError(RuntimeError):
    """A deploy that failed; the message says why (it goes to the node's history)."""


def _chunks(stream: IO[bytes], digest: Any) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        yield chunk


def _gunzip(chunks: Iterator[bytes]) -> Iterator[bytes]:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    for chunk in chunks:
        yield inflater.decompress(chunk)
    yield inflater.flush()


def _unzstd(chunks: Iterator[bytes]) -> Iterator[bytes]:
    if shutil.which("zstd") is None:
        raise DeployError("image is zstd-compressed but this ramdisk has no zstd")
    import threading

    proc = subprocess.Popen(["zstd", "-dc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    feeder_error: list[BaseException] = []

    def feed() -> None:
        try:
            for chunk in chunks:
                proc.stdin.write(chunk)  # type: ignore[union-attr]
        except BaseException as exc:  # surfaced below, in the writer's thread
            feeder_error.append(exc)
        finally:
            proc.stdin.close()  # type: ignore[union-attr]

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    while block := proc.stdout.read(CHUNK):
        yield block
    feeder.join()
    if proc.wait() != 0 or feeder_error:
        raise DeployError(f"zstd failed: {feeder_error[0] if feeder_error else proc.returncode}")


def write_image(job: dict[str, Any], *, device_dir: Path = Path("/dev"),
                opener: Callable[[str], IO[bytes]] | None = None) -> int:
    """Stream ``job['url']`` onto ``device_dir/job['disk']``; return the bytes written."""
    target = device_dir / job["disk"]
    digest = hashlib.sha256()
    open_url = opener or (lambda url: urllib.request.urlopen(url, timeout=60))  # noqa: S310
    written = 0
    with open_url(job["url"]) as stream, open(target, "r+b" if target.exists() else "wb") as disk:
        chunks = _chunks(stream, digest)
        data = {"raw": lambda c: c, "raw.gz": _gunzip, "raw.zst": _unzstd}.get(job["format"])
        if data is None:
            raise DeployError(f"image format {job['format']!r} cannot be streamed")
        for block in data(chunks):
            disk.write(block)
            written += len(block)
        disk.flush()
        os.fsync(disk.fileno())
    if digest.hexdigest() != job["sha256"]:
        wipe_boot_area(target)
        raise DeployError(f"sha256 mismatch: expected {job['sha256']}, got "
                          f"{digest.hexdigest()}; the disk's boot area was wiped")
    return written


def wipe_boot_area(target: Path) -> None:
    with open(target, "r+b") as disk:
        size = disk.seek(0, os.SEEK_END)
        disk.seek(0)
        disk.write(bytes(min(BOOT_AREA, size)))
        if size > 2 * BOOT_AREA:
            disk.seek(size - BOOT_AREA)
            disk.write(bytes(BOOT_AREA))
        disk.flush()
        os.fsync(disk.fileno())
