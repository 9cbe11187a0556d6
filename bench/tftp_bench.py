"""TFTP: one 1 MiB file to N concurrent clients, the daemon's TftpServer vs tftpd-hpa.

Both servers run as their own process on loopback and serve the same directory; N client
processes start at once and each fetches the whole file; the score is the wall time until
the last one finished (every copy is checked byte for byte, a failed or short copy counts
as a failure). Clients: tftp-hpa (512-byte blocks, like a plain PXE ROM) and atftp with
blksize 1468 (like iPXE). Rounds alternate between the servers; the median is reported.
Every client's source address is 127.0.0.1, so the TftpServer's workers, which are steered
by source address, serve them all in one process (docs/performance.md, "TFTP").

Run from the repository root:  python3 bench/tftp_bench.py [--clients 200]
Needs: tftpd-hpa, tftp-hpa, atftp. Stops every process it starts.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import asyncio
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _netns import stop


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_ours(root: Path, port: int) -> None:
    """The daemon's TFTP server alone, until SIGTERM."""
    import signal

    from provisioner.boot.tftp import TftpServer
    from provisioner.config import TftpSettings

    async def run() -> None:
        # every bench client shares 127.0.0.1: lift the per-address cap (a machine needs one)
        server = TftpServer(TftpSettings(listen=f"127.0.0.1:{port}"), root,
                            max_per_source=100_000)
        await server.start()
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await stopping.wait()
        await server.stop()

    asyncio.run(run())


def start(name: str, root: Path, port: int) -> subprocess.Popen[bytes]:
    if name == "provisioner":
        cmd = [sys.executable, __file__, "--serve", str(root), str(port)]
    else:
        cmd = ["in.tftpd", "-L", "-a", f"127.0.0.1:{port}", "-s", "-u", "root", str(root)]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 15
    while not subprocess.run(["ss", "-Hlun", f"sport = :{port}"], capture_output=True,
                             text=True).stdout.strip():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} does not listen on {port}")
        time.sleep(0.05)
    return proc


def client_cmd(kind: str, port: int, out: Path) -> list[str]:
    if kind == "tftp-hpa":
        return ["tftp", "127.0.0.1", str(port), "-m", "binary", "-c", "get", "file1m", str(out)]
    return ["atftp", "--option", "blksize 1468", "-g", "-r", "file1m", "-l", str(out),
            "127.0.0.1", str(port)]


async def round_trip(kind: str, port: int, clients: int, work: Path,
                     digest: str) -> tuple[float, int]:
    """Wall seconds for ``clients`` concurrent fetches, and how many failed."""
    outs = [work / f"out{i}" for i in range(clients)]
    started = time.perf_counter()
    procs = [await asyncio.create_subprocess_exec(*client_cmd(kind, port, out),
                                                  stdout=asyncio.subprocess.DEVNULL,
                                                  stderr=asyncio.subprocess.DEVNULL)
             for out in outs]
    await asyncio.gather(*(proc.wait() for proc in procs))
    elapsed = time.perf_counter() - started
    failed = sum(1 for out in outs if not out.exists()
                 or hashlib.sha256(out.read_bytes()).hexdigest() != digest)
    for out in outs:
        out.unlink(missing_ok=True)
    return elapsed, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default="tftp-hpa,atftp", help="clients to run")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_ours(Path(args.serve[0]), int(args.serve[1]))
        return 0
    with tempfile.TemporaryDirectory(prefix="tftpbench") as tmp:
        root, work = Path(tmp) / "root", Path(tmp) / "work"
        root.mkdir()
        work.mkdir()
        data = os.urandom(1024 * 1024)
        (root / "file1m").write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        rows = []
        for kind in args.kinds.split(","):
            times: dict[str, list[float]] = {"provisioner": [], "tftpd-hpa": []}
            failures = dict.fromkeys(times, 0)
            for _ in range(args.rounds):
                for name in times:
                    port = free_port()
                    proc = start(name, root, port)
                    try:
                        elapsed, failed = asyncio.run(
                            round_trip(kind, port, args.clients, work, digest))
                    finally:
                        stop(proc)
                    times[name].append(elapsed)
                    failures[name] += failed
                    print(f"{kind:8} {name:11} {args.clients} clients: {elapsed:6.2f} s, "
                          f"{failed} failed", file=sys.stderr)
            ours, peer = (statistics.median(times[n]) for n in ("provisioner", "tftpd-hpa"))
            rows.append(f"| {kind} | {args.clients} | {ours:.2f} s | {peer:.2f} s | "
                        f"{peer / ours:.2f}× | {failures['provisioner']} / "
                        f"{failures['tftpd-hpa']} |")
    print("| client | concurrent | provisioner (median wall) | tftpd-hpa | ratio "
          "(tftpd-hpa time / ours) | failed copies (ours / tftpd-hpa) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
