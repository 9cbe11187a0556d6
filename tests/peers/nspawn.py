"""A Debian root booted with systemd as PID 1 (``systemd-nspawn --boot``, Debian package
systemd-container), on a throwaway overlay over a cached root (tests/peers/debootstrap.py):
the container's writes land in the overlay's upper dir and vanish with it.

The container has a private network (only its own ``lo``), is not registered with
systemd-machined (the CI machine's PID 1 is not systemd) and keeps the caller's cgroup.
``run`` executes a program of the container in all of its namespaces (``nsenter -a``);
``host`` runs a program of the host in its network namespace only (checks from outside).
Measured on the CI machine type (2 cores): boot to ``running`` 3-6 s, halt ~2 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Final

from tests.peers.debootstrap import unmount_under

BOOT_TIMEOUT_S: Final = 150.0


def nspawn_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "systemd-nspawn --boot needs root"
    for tool, package in (("systemd-nspawn", "systemd-container"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} not found: apt-get install {package} (scripts/setup.sh APT_PACKAGES)"
    return None


class BootedRoot:
    """``with BootedRoot(lower, work) as box:`` boots; leaving halts and removes the overlay."""

    def __init__(self, lower: Path, work: Path, binds_ro: dict[Path, str] | None = None) -> None:
        self.lower = lower
        self.work = work
        self.merged = work / "merged"
        self.binds_ro = binds_ro or {}
        self.log_path = work / "nspawn.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0

    def __enter__(self) -> BootedRoot:
        for sub in ("upper", "ovl-work", "merged"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={self.lower},upperdir={self.work / 'upper'},"
                        f"workdir={self.work / 'ovl-work'}", str(self.merged)],
                       check=True, capture_output=True)
        try:
            self._boot()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _boot(self) -> None:
        binds = [f"--bind-ro={host}:{inside}" for host, inside in self.binds_ro.items()]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                ["systemd-nspawn", "--quiet", "-D", str(self.merged), "--boot",
                 "--register=no", "--keep-unit", "--private-network", "--console=pipe",
                 f"--machine=ptest{os.getpid()}", *binds],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        state, error = "", ""
        while time.monotonic() < deadline:
            self._check_alive()
            # nspawn's first child is its "outer child", which forks the container's PID 1
            # and exits: look again until the child found is the init in a PID namespace of
            # its own (a pid taken too early made every nsenter fail: a flaky boot)
            self.leader = _container_init(self.proc.pid)
            if self.leader:
                done = self.run("systemctl", "is-system-running", check=False)
                state, error = done.stdout.strip(), done.stderr.strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.5)
        raise AssertionError(f"the container's systemd is {state!r} after {BOOT_TIMEOUT_S} s "
                             f"({error[-300:]!r}): {self.log()}")

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited {self.proc.returncode}: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def run(self, *argv: str, check: bool = True, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A program of the container, in all its namespaces, as root."""
        envs = [f"{key}={value}" for key, value in (env or {}).items()]
        cmd = ["nsenter", "-t", str(self.leader), "-a", "env", "-i",
               "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", *envs, *argv]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {done.returncode}\n{done.stdout}\n"
                                 f"{done.stderr}")
        return done

    def host(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A program of the host in the container's network namespace."""
        return subprocess.run(["nsenter", "-t", str(self.leader), "-n", *argv],
                              capture_output=True, text=True, timeout=timeout, check=False)

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # nspawn asks the container to power off
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        unmount_under(self.work)
        subprocess.run(["umount", "-l", str(self.merged)], check=False, capture_output=True)
        shutil.rmtree(self.work / "ovl-work", ignore_errors=True)


def _container_init(pid: int) -> int:
    """The container's PID 1: a child of ``pid`` (nspawn) in another PID namespace than
    ours; 0 while there is none yet."""
    ours = os.readlink("/proc/self/ns/pid")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and os.readlink(entry / "ns" / "pid") != ours:
                return int(entry.name)
        except (OSError, IndexError, ValueError):
            continue
    return 0
