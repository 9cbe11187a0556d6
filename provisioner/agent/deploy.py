"""Writes an OS image to a disk as it downloads: no full copy in RAM or on tmpfs.

The sha256 covers the file as served (compressed, qcow2 or raw). When it does not match,
the first and last MiB of the disk (partition tables, boot code, the GPT backup) are
zeroed, so firmware never boots a half-written or wrong image. When it matches, the last
partition is grown and the cloud-init seed the daemon built is written to a partition
added at the disk's end. Standard library only (``zstd`` is used as a pipe when an image
needs it)."""

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

from provisioner.agent.partition import PartitionError, grow_and_add_seed
from provisioner.agent.qcow2 import Qcow2Error, Qcow2Writer

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
                opener: Callable[[str], IO[bytes]] | None = None,
                fetch_seed: Callable[[], bytes] | None = None) -> dict[str, Any]:
    """Stream ``job['url']`` onto ``device_dir/job['disk']``, check it, then grow the last
    partition and write the seed (when ``job['seed']``); returns what was done."""
    target = device_dir / job["disk"]
    digest = hashlib.sha256()
    open_url = opener or (lambda url: urllib.request.urlopen(url, timeout=60))  # noqa: S310
    with open_url(job["url"]) as stream, open(target, "r+b" if target.exists() else "wb") as disk:
        written = _stream(job["format"], _chunks(stream, digest), disk)
        disk.flush()
        os.fsync(disk.fileno())
    if digest.hexdigest() != job["sha256"]:
        wipe_boot_area(target)
        raise DeployError(f"sha256 mismatch: expected {job['sha256']}, got "
                          f"{digest.hexdigest()}; the disk's boot area was wiped")
    report: dict[str, Any] = {"bytes": written, "sha256": digest.hexdigest()}
    if job.get("seed") and fetch_seed is not None:
        report["layout"] = write_seed(target, fetch_seed())
    return report


def _stream(image_format: str, chunks: Iterator[bytes], disk: IO[bytes]) -> int:
    """Write the image's guest bytes to ``disk``; returns the disk bytes it covers."""
    if image_format == "qcow2":
        size = disk.seek(0, os.SEEK_END)
        disk.seek(0)
        try:
            writer = Qcow2Writer(disk, size)
            for chunk in chunks:
                writer.feed(chunk)
            return writer.finish()
        except Qcow2Error as exc:
            raise DeployError(str(exc)) from None
    data = {"raw": lambda c: c, "raw.gz": _gunzip, "raw.zst": _unzstd}.get(image_format)
    if data is None:
        raise DeployError(f"image format {image_format!r} cannot be streamed")
    written = 0
    for block in data(chunks):
        disk.write(block)
        written += len(block)
    return written


def write_seed(target: Path, seed: bytes) -> str:
    """Grow the last partition, add the seed partition at the disk's end, write ``seed``."""
    if not seed:
        raise DeployError("the daemon sent an empty cloud-init seed")
    with open(target, "r+b") as disk:
        try:
            layout = grow_and_add_seed(disk, len(seed))
        except PartitionError as exc:
            raise DeployError(f"cannot add the cloud-init seed: {exc}") from None
        disk.seek(layout.seed_start * 512)
        disk.write(seed.ljust(layout.seed_sectors * 512, b"\0"))
        disk.flush()
        os.fsync(disk.fileno())
    return layout.describe()


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
