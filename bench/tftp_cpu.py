"""TFTP: CPU seconds per transfer, the daemon's TftpServer (with its worker processes) vs
tftpd-hpa: what each server process tree spends, whatever else runs on the machine.

``tftp_bench.py`` scores wall time, which on a busy machine mostly measures the share of
the CPU a server gets; this measures the work. Each server runs under ``perf stat -e
task-clock`` (children counted: our workers, tftpd-hpa's forks), N clients fetch a 1 MiB
file at once (tftp-hpa with 512-byte blocks, then atftp with blksize 1468), then the server
is stopped and perf reports its tree's CPU time, less that of a round without clients
(starting and stopping the server).

Run from the repository root:  python3 bench/tftp_cpu.py [--clients 80] [--workers N]
Needs: perf, tftpd-hpa, tftp-hpa, atftp. Stops every process it starts.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tftp_bench import client_cmd, free_port

_SERVE = """
import asyncio, signal, sys
from pathlib import Path
from provisioner.boot.tftp import TftpServer
from provisioner.config import TftpSettings

async def main() -> None:
    settings = TftpSettings(listen=f"127.0.0.1:{sys.argv[2]}", workers=int(sys.argv[3]) or None)
    server = TftpServer(settings, Path(sys.argv[1]), max_per_source=100_000)
    await server.start()
    print("ready", flush=True)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await stopping.wait()
    await server.stop()

asyncio.run(main())
"""


def measure(name: str, root: Path, work: Path, kind: str, clients: int,
            workers: int) -> tuple[float, float, int]:
    """(server CPU seconds, wall seconds, failed clients) for one round."""
    port = free_port()
    report = work / "perf.txt"
    server = [sys.executable, "-c", _SERVE, str(root), str(port), str(workers)] \
        if name == "provisioner" else \
        ["in.tftpd", "-L", "-a", f"127.0.0.1:{port}", "-s", "-u", "root", str(root)]
    perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "task-clock", "-o", str(report),
                             "--", *server], stdout=subprocess.PIPE, text=True)
    try:
        if name == "provisioner":
            assert perf.stdout is not None
            perf.stdout.readline()  # ready: its workers run
        else:
            time.sleep(1.0)
        started = time.perf_counter()
        procs = [subprocess.Popen(client_cmd(kind, "127.0.0.1", port, work / f"out{i}"),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for i in range(clients)]
        failed = sum(proc.wait() != 0 for proc in procs)
        wall = time.perf_counter() - started
    finally:
        children = Path(f"/proc/{perf.pid}/task/{perf.pid}/children").read_text().split()
        for child in children:
            os.kill(int(child), signal.SIGTERM)
        perf.wait(30)
    line = next(x for x in report.read_text().splitlines() if "task-clock" in x)
    return float(line.split(",")[0]) / 1000, wall, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=80)
    parser.add_argument("--workers", type=int, default=0, help="tftp.workers (0: default)")
    args = parser.parse_args()
    print("| client | server | CPU seconds | ms per transfer | wall | failed |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="tftpcpu") as tmp:
        root, work = Path(tmp) / "root", Path(tmp) / "work"
        root.mkdir()
        work.mkdir()
        (root / "file1m").write_bytes(os.urandom(1024 * 1024))
        for kind in ("tftp-hpa", "atftp"):
            for name in ("provisioner", "tftpd-hpa"):
                idle, _, _ = measure(name, root, work, kind, 0, args.workers)
                cpu, wall, failed = measure(name, root, work, kind, args.clients, args.workers)
                cpu -= idle  # starting and stopping (Python's imports): not per transfer
                print(f"| {kind} | {name} | {cpu:.2f} | {cpu / args.clients * 1000:.1f} | "
                      f"{wall:.2f} s | {failed} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
