"""``provisioner serve`` prepares its own boot artefacts: at start, every configured
architecture's inspection ramdisk (and the arm64 GRUB image) is built in the background when
missing or stale, in a child process, so READY is never delayed and the event loop never
blocked. Where the Debian packages are missing, it says once what to install."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from provisioner.ramdisk.sysroot import arch_named, requirements_hint

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BuildJob:
    arch: str
    kernel: Path
    initrd: Path
    cache_dir: Path
    grub: Path | None = None  # arm64: the GRUB netboot image, built for base_url
    base_url: str | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "provisioner.ramdisk", "--arch", self.arch,
               "--kernel", str(self.kernel), "--initrd", str(self.initrd),
               "--cache-dir", str(self.cache_dir)]
        if self.grub is not None and self.base_url:
            cmd += ["--grub", str(self.grub), "--base-url", self.base_url]
        return cmd


class RamdiskBuilder:
    """A boot ``Server`` whose start only schedules the builds."""

    def __init__(self, jobs: list[BuildJob]) -> None:
        self._jobs = jobs
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self.done = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ramdisk-build")

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        try:
            for job in self._jobs:
                await self._build(job)
        finally:
            self.done.set()

    async def _build(self, job: BuildJob) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *job.command(), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await self._proc.communicate()
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        if self._proc.returncode == 0:
            for line in lines:
                log.info("%s", line)  # "built the arm64 inspection ramdisk: ..." or nothing
            log.info("%s inspection ramdisk ready: %s", job.arch, job.initrd)
            return
        reason = lines[-1] if lines else f"exit {self._proc.returncode}"
        log.warning("%s inspection ramdisk not built (%s): %s nodes cannot be inspected "
                    "until it is; to build it: %s, then restart or run `provisioner ramdisk "
                    "build --arch %s`", job.arch, reason, job.arch,
                    requirements_hint(arch_named(job.arch)), job.arch)
