"""TFTP: one 1 MiB file to N concurrent clients, the daemon's TftpServer vs tftpd-hpa.

Both servers run as their own process on loopback and serve the same directory; N client
processes start at once and each fetches the whole file; the score is the wall time until
the last one finished (every copy is checked byte for byte, a failed or short copy counts
as a failure). Clients: tftp-hpa (512-byte blocks, like a plain PXE ROM) and atftp with
blksize 1468 (like iPXE). Rounds alternate between the servers (ours, theirs, ours, …);
each round's ratio is taken within the round, and the bench prints every round's ratio and
their median with its spread (min–max); the table's ratio is that median.
Every client's source address is 127.0.0.1, so the TftpServer's workers, which are steered
by source address, serve them all in one process (docs/performance.md, "TFTP").

``--addresses N`` runs the same in network namespaces instead: the servers in one, the
clients spread over N others, each joined to the servers' by a veth pair of its own, so
the clients come from N source addresses (as a rack's machines do) and the TftpServer's
requests spread over its workers.

Run from the repository root:  python3 bench/tftp_bench.py [--clients 200] [--addresses N]
Needs: tftpd-hpa, tftp-hpa, atftp (and root, for --addresses). Stops every process it
starts, and deletes the namespaces it made.
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

import _rounds
from _netns import add_namespace, join, sh, stop, wait_listening

NET = "10.201"  # --addresses: the servers are NET.K.1, the clients of namespace K NET.K.2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Net:
    """Where the servers listen and where each client runs: loopback, or namespaces."""

    def __init__(self, addresses: int) -> None:
        self.addresses = addresses
        self.server_ns = f"pvtftps{os.getpid()}" if addresses else ""
        self.client_ns = [f"pvtftpc{k}x{os.getpid()}" for k in range(addresses)]

    def __enter__(self) -> Net:
        try:
            if self.addresses:
                add_namespace(self.server_ns)
            for k, ns in enumerate(self.client_ns):
                add_namespace(ns)
                join(self.server_ns, f"vs{k}", f"{NET}.{k}.1/24", ns, "vc0", f"{NET}.{k}.2/24")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        for ns in (*self.client_ns, self.server_ns):
            if ns:
                sh("ip", "netns", "del", ns, check=False)

    @property
    def listen_host(self) -> str:
        return "0.0.0.0" if self.addresses else "127.0.0.1"

    def in_server(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.server_ns, *cmd] if self.addresses else cmd

    def client(self, i: int) -> tuple[list[str], str]:
        """Client ``i``'s command prefix and the server address it asks."""
        if not self.addresses:
            return [], "127.0.0.1"
        k = i % self.addresses
        return ["ip", "netns", "exec", self.client_ns[k]], f"{NET}.{k}.1"

    def wait_listening(self, port: int) -> None:
        wait_listening(self.server_ns, "u", port, timeout_s=15)


def serve_ours(root: Path, port: int, host: str) -> None:
    """The daemon's TFTP server alone, until SIGTERM."""
    import signal

    from provisioner.boot.tftp import TftpServer
    from provisioner.config import TftpSettings

    async def run() -> None:
        # bench clients share addresses: lift the per-address cap (a machine needs one)
        server = TftpServer(TftpSettings(listen=f"{host}:{port}"), root,
                            max_per_source=100_000)
        await server.start()
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await stopping.wait()
        await server.stop()

    asyncio.run(run())


def start(name: str, root: Path, port: int, net: Net) -> subprocess.Popen[bytes]:
    if name == "provisioner":
        cmd = [sys.executable, __file__, "--serve", str(root), str(port), net.listen_host]
    else:
        cmd = ["in.tftpd", "-L", "-a", f"{net.listen_host}:{port}", "-s", "-u", "root",
               str(root)]
    proc = subprocess.Popen(net.in_server(cmd))
    net.wait_listening(port)
    return proc


def client_cmd(kind: str, host: str, port: int, out: Path) -> list[str]:
    if kind == "tftp-hpa":
        return ["tftp", host, str(port), "-m", "binary", "-c", "get", "file1m", str(out)]
    return ["atftp", "--option", "blksize 1468", "-g", "-r", "file1m", "-l", str(out),
            host, str(port)]


async def round_trip(kind: str, port: int, clients: int, work: Path, digest: str,
                     net: Net) -> tuple[float, int]:
    """Wall seconds for ``clients`` concurrent fetches, and how many failed."""
    outs = [work / f"out{i}" for i in range(clients)]
    commands = []
    for i, out in enumerate(outs):
        prefix, host = net.client(i)
        commands.append([*prefix, *client_cmd(kind, host, port, out)])
    started = time.perf_counter()
    procs = [await asyncio.create_subprocess_exec(*command,
                                                  stdout=asyncio.subprocess.DEVNULL,
                                                  stderr=asyncio.subprocess.DEVNULL)
             for command in commands]
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
    parser.add_argument("--addresses", type=int, default=0,
                        help="clients from this many source addresses, in namespaces "
                        "(0: all on loopback, 127.0.0.1)")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_ours(Path(args.serve[0]), int(args.serve[1]), args.serve[2])
        return 0
    with tempfile.TemporaryDirectory(prefix="tftpbench") as tmp, Net(args.addresses) as net:
        root, work = Path(tmp) / "root", Path(tmp) / "work"
        root.mkdir()
        work.mkdir()
        data = os.urandom(1024 * 1024)
        (root / "file1m").write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        rows, summaries = [], []
        for kind in args.kinds.split(","):
            times: dict[str, list[float]] = {"provisioner": [], "tftpd-hpa": []}
            failures = dict.fromkeys(times, 0)
            for _ in range(args.rounds):  # interleaved: ours, theirs, ours, theirs, …
                for name in times:
                    port = free_port()
                    proc = start(name, root, port, net)
                    try:
                        elapsed, failed = asyncio.run(
                            round_trip(kind, port, args.clients, work, digest, net))
                    finally:
                        stop(proc)
                    times[name].append(elapsed)
                    failures[name] += failed
                    print(f"{kind:8} {name:11} {args.clients} clients: {elapsed:6.2f} s, "
                          f"{failed} failed", file=sys.stderr)
            ours, peer = (statistics.median(times[n]) for n in ("provisioner", "tftpd-hpa"))
            # each round's ratio within that round; the table shows their median
            ratios = [_rounds.ratio(t, o) for o, t in zip(times["provisioner"],
                                                          times["tftpd-hpa"], strict=True)]
            rows.append(f"| {kind} | {args.clients} | {ours:.2f} s | {peer:.2f} s | "
                        f"{_rounds.cell(_rounds.median(ratios))} | "
                        f"{failures['provisioner']} / {failures['tftpd-hpa']} |")
            summaries.append(_rounds.summary(f"{kind} (tftpd-hpa time / ours)", ratios))
    print(f"{args.rounds} round(s) a client, interleaved (ours, tftpd-hpa, ours, …), "
          f"{args.addresses or 'one'} source address(es); ratio: the median of the rounds' ratios")
    print("| client | concurrent | provisioner (median wall) | tftpd-hpa | ratio "
          "(tftpd-hpa time / ours) | failed copies (ours / tftpd-hpa) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("\n".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
