"""The REST API over a large fleet: list and filter latency (p50/p99) and the daemon's RSS
(DESIGN §9: 10,000 nodes p99 <= 50 ms; 100,000 nodes in the store, RSS <= 500 MB).

    python3 bench/api_bench.py [--nodes 10000 100000] [--requests 300]

Nodes are written straight into a migrated SQLite store (a bulk insert, not the lifecycle),
then ``provisioner serve`` answers page requests (limit 100) with the filters operators use.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import http.client
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

# Stable states only: in-flight nodes would be resumed (real work) while we measure.
STATES = ["active"] * 8 + ["inspect_failed", "inspected", "deploy_failed", "enrolled"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pv(config: Path, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                           *args], check=True, capture_output=True, text=True).stdout


def seed(config: Path, db: Path, count: int) -> None:
    pv(config, "db", "upgrade")
    import sqlite3

    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    rows, macs = [], []
    for i in range(count):
        node_id = str(uuid.UUID(int=i + 1))
        rows.append((node_id, f"gpu-{i:06d}", f"SN{i:08d}", random.choice(STATES),
                     i % 97 == 0, f"r{i // 40:04d}", "h100", "{}", "[]", 1, 1, now, now))
        macs.append((f"02:00:{i >> 24 & 255:02x}:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:"
                     f"{i & 255:02x}", node_id))
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO node (id, hostname, serial, state, maintenance, rack, profile, facts,"
            " checkpoint, version, history_seq, created_at, updated_at, maintenance_reason,"
            " last_error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,'','')", rows)
        conn.executemany("INSERT INTO node_mac (mac, node_id) VALUES (?, ?)", macs)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(port: int, token: str, paths: list[str], requests: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}"}
    timings = []
    for i in range(requests):
        path = paths[i % len(paths)]
        started = time.perf_counter()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        timings.append((time.perf_counter() - started) * 1000)
        if response.status != 200:
            raise SystemExit(f"{path}: {response.status} {body[:200]!r}")
    return timings


def run(count: int, requests: int) -> tuple[float, float, float, float]:
    work = Path(tempfile.mkdtemp(prefix="pv-api-bench-"))
    port = free_port()
    config = work / "provisioner.toml"
    config.write_text(f'state_dir = "{work}"\n[api]\nlisten = "127.0.0.1:{port}"\n'
                      '[lifecycle]\nauto_inspect = false\nauto_deploy = false\n'
                      '[log]\nlevel = "WARNING"\n')
    seed(config, work / "provisioner.sqlite", count)
    token = pv(config, "token", "create", "--role", "viewer", "--name", "bench").split()[-1]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(work / "notify.sock"))
    notify.settimeout(300)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, NOTIFY_SOCKET=str(work / "notify.sock")))
    try:
        # READY=1 comes after recovery has looked at every node, as systemd would wait.
        while not notify.recv(4096).startswith(b"READY=1"):
            pass
        ready_s = time.monotonic() - started
        racks = max(1, count // 40)
        paths = ["/api/v1/nodes?limit=100", "/api/v1/nodes?state=deploy_failed&limit=100",
                 f"/api/v1/nodes?rack=r{racks // 2:04d}", "/api/v1/nodes?maintenance=true",
                 f"/api/v1/nodes?q=gpu-00{count // 3:04d}"[:40],
                 f"/api/v1/nodes?limit=100&offset={count - 150}", "/api/v1/nodes/gpu-000042"]
        measure(port, token, paths, 20)  # warm up
        timings = sorted(measure(port, token, paths, requests))
        rss = rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        notify.close()
        shutil.rmtree(work, ignore_errors=True)
    p99 = timings[int(len(timings) * 0.99) - 1]
    return statistics.median(timings), p99, rss, ready_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    print("| nodes in store | start to READY=1 | p50 | p99 | daemon RSS |\n|---|---|---|---|---|")
    for count in args.nodes:
        p50, p99, rss, ready_s = run(count, args.requests)
        print(f"| {count:,} | {ready_s:.1f} s | {p50:.1f} ms | {p99:.1f} ms | {rss:.0f} MiB |",
              flush=True)


if __name__ == "__main__":
    main()
