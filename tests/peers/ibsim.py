"""A simulated InfiniBand fabric: ibsim + OpenSM, diag tools through umad2sim (PEERS.md §8).

Everything runs inside a network namespace the test creates: ibsim's control socket
(``sim:ctl``) is an abstract Unix socket, so one ibsim per namespace, and parallel tests
stay apart. ibsim reads console commands (``Unlink "ib-leaf-04"[4]``) on its stdin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.peers.netns import netns_unavailable_reason, plain_namespace
from tests.peers.ports import stop_process

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
TOOLS = ("ibsim", "opensm", "ibnetdiscover", "iblinkinfo", "sminfo")


def ibsim_unavailable_reason() -> str | None:
    if (reason := netns_unavailable_reason()) is not None:
        return reason
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing or not UMAD2SIM.exists():
        what = ", ".join(missing) or str(UMAD2SIM)
        return f"ibsim-utils/opensm/infiniband-diags not installed ({what}): run scripts/setup.sh"
    return None


@dataclass
class SimFabric:
    namespace: str
    workdir: Path
    sim: subprocess.Popen[bytes]

    def run(self, *command: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A diag tool attached to the simulator (stderr carries ibsim's 'attached' notice)."""
        env = dict(os.environ, LD_PRELOAD=str(UMAD2SIM))
        return subprocess.run(["ip", "netns", "exec", self.namespace, *command], env=env,
                              capture_output=True, text=True, timeout=timeout_s, check=False)

    def console(self, command: str) -> None:
        """An ibsim console command, e.g. ``Unlink "ib-leaf-03"[6]``."""
        assert self.sim.stdin is not None
        self.sim.stdin.write(command.encode() + b"\n")
        self.sim.stdin.flush()

    def wait_for(self, predicate: Callable[[str], bool], timeout_s: float = 20.0) -> str:
        """Poll ``ibnetdiscover`` until ``predicate(stdout)`` holds; its output, or
        RuntimeError after ``timeout_s`` (a console command that did not take)."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = self.run("ibnetdiscover").stdout
            if predicate(out):
                return out
            if time.monotonic() > deadline:
                raise RuntimeError(f"fabric did not change within {timeout_s} s")
            time.sleep(0.2)


@contextmanager
def running_fabric(net_file: Path, workdir: Path) -> Iterator[SimFabric]:
    """ibsim on ``net_file`` and OpenSM; yields once the SM is MASTER (LIDs assigned)."""
    with plain_namespace() as namespace:
        prefix = ["ip", "netns", "exec", namespace.name]
        sim_log = open(workdir / "ibsim.log", "wb")  # noqa: SIM115 - closed below
        sim = subprocess.Popen([*prefix, "ibsim", "-s", str(net_file)], stdin=subprocess.PIPE,
                               stdout=sim_log, stderr=subprocess.STDOUT)
        osm = None
        try:
            time.sleep(0.3)
            (workdir / "osmcache").mkdir(exist_ok=True)
            env = dict(os.environ, LD_PRELOAD=str(UMAD2SIM),
                       OSM_CACHE_DIR=str(workdir / "osmcache"))
            osm = subprocess.Popen([*prefix, "opensm", "-f", str(workdir / "opensm.log")], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            fabric = SimFabric(namespace.name, workdir, sim)
            _wait_master(fabric, sim, osm)
            yield fabric
        finally:
            for proc in (osm, sim):
                if proc is not None:
                    _stop(proc)
            sim_log.close()


def _wait_master(fabric: SimFabric, sim: subprocess.Popen[bytes],
                 osm: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sim.poll() is not None or osm.poll() is not None:
            raise RuntimeError(f"ibsim/opensm exited: {(fabric.workdir / 'ibsim.log').read_text()}")
        if "SMINFO_MASTER" in fabric.run("sminfo", timeout_s=10).stdout:
            return
        time.sleep(0.3)
    raise RuntimeError("OpenSM did not become MASTER in 30 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    stop_process(proc)
