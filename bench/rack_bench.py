"""A simulated rack through the whole lifecycle: N nodes enrolled -> active on the fake
drivers, measuring wall time and the daemon's CPU time per node (DESIGN §9: 1,000 nodes,
<= 10 min wall, 0 failed; <= 50 ms daemon CPU per node since issue 29, was 100).

    python3 bench/rack_bench.py [--nodes 1000] [--step-delay-s 0.2] [--profile FILE]

``--profile FILE`` samples the daemon (every thread, on-CPU only) with py-spy, found on PATH
or named by ``--py-spy``, into FILE as collapsed stacks (one ``frame;frame;... count`` a line,
the input of flamegraph.pl and speedscope); ``bench/profile_top.py FILE`` prints the top
entries. The sampler runs in its own process, so the CPU figure is the daemon's alone.

The fake drivers stand in for BMCs, PXE clients and kubelets, so this measures the daemon's
own cost (conductor, store, checkpoints, policy), not the hardware's.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import _proc
import _profile
import argparse
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def counts(db: Path) -> dict[str, int]:
    try:
        with sqlite3.connect(db) as conn:
            return dict(conn.execute("SELECT state, count(*) FROM node GROUP BY state"))
    except sqlite3.OperationalError:
        return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--step-delay-s", type=float, default=0.2)
    _profile.add_arguments(parser, "write py-spy's collapsed stacks here")
    args = parser.parse_args()
    spy = _profile.py_spy(args)
    work = Path(tempfile.mkdtemp(prefix="pv-rack-bench-"))
    config = work / "provisioner.toml"
    config.write_text(
        f'state_dir = "{work / "state"}"\n[api]\nlisten = "127.0.0.1:{free_port()}"\n'
        f"[simulation]\nnodes = {args.nodes}\nracks = {max(1, args.nodes // 40)}\n"
        f"step_delay_s = {args.step_delay_s}\n"
        "[lifecycle]\nmax_inspecting = 500\nmax_deploying = 200\nmax_in_flight = 1000\n"
        '[log]\nlevel = "WARNING"\n')
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sampler = None if spy is None else _profile.start(spy, proc.pid, args.profile, rate=200)
    db = work / "state" / "provisioner.sqlite"
    peak_rss = 0.0
    try:
        while True:
            now = counts(db)
            peak_rss = max(peak_rss, rss_mib(proc.pid))
            done = now.get("active", 0)
            failed = sum(n for state, n in now.items() if state.endswith("_failed"))
            if done + failed >= args.nodes:
                break
            if proc.poll() is not None:
                raise SystemExit("the daemon exited")
            time.sleep(0.5)
        wall = time.monotonic() - started
        cpu = _proc.cpu_seconds(proc.pid)
        _profile.stop([sampler])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    print("| nodes | wall, enrolled -> active | daemon CPU per node | peak RSS | failed |")
    print("|---|---|---|---|---|")
    print(f"| {args.nodes:,} | {wall:.1f} s | {cpu / args.nodes * 1000:.1f} ms | "
          f"{peak_rss:.0f} MiB | {failed} |")


if __name__ == "__main__":
    main()
