"""The console's fleet page over a large fleet: server time (the ``Server-Timing`` header the
API sets: from the request reaching the app to the response being ready, auth included)
and the client's wall time, p50/p99 (issue 12: 10,000 nodes, server time p99 <= 200 ms).

    python3 bench/console_bench.py [--nodes 10000] [--requests 100]

Nodes are written straight into a migrated SQLite store (``api_bench.py``'s way: stable
states, 40 per rack, with positions), ``provisioner serve`` starts, a viewer signs in through
the form, and one keep-alive client asks for the fleet page: unfiltered (every node's rack
cell plus the first 100 rows), filtered by state, and a page deep in the table; first with the fleet
unchanged (counts and rack elevation come from the cache), then with a node changed (an
operator's maintenance toggle) before every request, so every page rebuilds them.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import http.client
import importlib.util
import math
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

_spec = importlib.util.spec_from_file_location("api_bench", Path(__file__).with_name(
    "api_bench.py"))
assert _spec is not None and _spec.loader is not None
api_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(api_bench)


def seed(config: Path, db: Path, count: int) -> None:
    api_bench.pv(config, "db", "upgrade")
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    rows = []
    for i in range(count):
        rows.append((str(uuid.UUID(int=i + 1)), f"gpu-{i:06d}", f"SN{i:08d}",
                     random.choice(api_bench.STATES), i % 97 == 0, f"r{i // 40:04d}",
                     f"u{i % 40 + 1}", "h100", "{}", "[]", 1, 1, now, now))
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO node (id, hostname, serial, state, maintenance, rack, position,"
            " profile, facts, checkpoint, version, history_seq, created_at, updated_at,"
            " maintenance_reason, last_error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,'','')", rows)


def sign_in(port: int, token: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/ui/signin", body=f"token={token}",
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    response = conn.getresponse()
    response.read()
    if response.status != 303:
        raise SystemExit(f"sign-in: {response.status}")
    return response.getheader("Set-Cookie", "").split(";")[0]


def touch(port: int, token: str, on: bool) -> None:
    """A maintenance toggle: every node's view is stale again (the uncached case)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    action = "maintenance-on" if on else "maintenance-off"
    conn.request("POST", f"/api/v1/nodes/gpu-000001/actions/{action}",
                 body='{"reason": "bench"}', headers={"Authorization": f"Bearer {token}",
                                                       "Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    if response.status != 202:
        raise SystemExit(f"{action}: {response.status}")


def measure(port: int, cookie: str, paths: list[str], requests: int,
            churn: str | None = None) -> tuple[list[float], list[float], int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    server, wall, size = [], [], 0
    for i in range(requests):
        path = paths[i % len(paths)]
        if churn is not None:
            touch(port, churn, on=i % 2 == 0)
        started = time.perf_counter()
        conn.request("GET", path, headers={"Cookie": cookie})
        response = conn.getresponse()
        body = response.read()
        wall.append((time.perf_counter() - started) * 1000)
        if response.status != 200 or b"data-hostname" not in body:
            raise SystemExit(f"{path}: {response.status} {body[:200]!r}")
        timing = response.getheader("Server-Timing", "")
        server.append(float(timing.partition("dur=")[2]))
        size = max(size, len(body))
    return server, wall, size


def event_latency(port: int, cookie: str, operator: str, count: int) -> list[float]:
    """ms from sending an operator's maintenance toggle to its transition arriving on
    ``/api/v1/events`` (the session's stream, as the console's script reads it)."""
    stream = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    stream.request("GET", "/api/v1/events", headers={"Cookie": cookie})
    events = stream.getresponse()
    events.fp.read1(65536)  # "retry" and the ": connected" comment
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        touch(port, operator, on=i % 2 == 0)
        seen = b""
        while b"event: transition" not in seen:
            seen += events.fp.read1(65536)
        latencies.append((time.perf_counter() - started) * 1000)
    stream.close()
    return latencies


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def run(count: int, requests: int) -> dict[str, dict[str, float]]:
    work = Path(tempfile.mkdtemp(prefix="pv-console-bench-"))
    port = api_bench.free_port()
    config = work / "provisioner.toml"
    config.write_text(f'state_dir = "{work}"\n[api]\nlisten = "127.0.0.1:{port}"\n'
                      '[lifecycle]\nauto_inspect = false\nauto_deploy = false\n'
                      '[log]\nlevel = "WARNING"\n')
    seed(config, work / "provisioner.sqlite", count)
    token = api_bench.pv(config, "token", "create", "--role", "viewer", "--name",
                         "bench").split()[-1]
    operator = api_bench.pv(config, "token", "create", "--role", "operator", "--name",
                            "bench-op").split()[-1]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(work / "notify.sock"))
    notify.settimeout(300)
    proc = subprocess.Popen([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, NOTIFY_SOCKET=str(work / "notify.sock")))
    try:
        while not notify.recv(4096).startswith(b"READY=1"):
            pass
        cookie = sign_in(port, token)
        paths = ["/ui/", "/ui/?state=deploy_failed", f"/ui/?offset={count // 2}"]
        cold = measure(port, cookie, paths[:1], 1)[0][0]  # builds every rack's view
        live = event_latency(port, cookie, operator, 100)
        measure(port, cookie, paths, 6)  # warm up
        results = {}
        for case, churn in (("unchanged fleet", None), ("a node changed before each", operator)):
            server, wall, size = measure(port, cookie, paths, requests, churn)
            results[case] = {"server_p50": statistics.median(server), "server_p99": p99(server),
                             "wall_p50": statistics.median(wall), "wall_p99": p99(wall),
                             "size_kib": size / 1024, "rss": api_bench.rss_mib(proc.pid)}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        notify.close()
        shutil.rmtree(work, ignore_errors=True)
    results["transition → /api/v1/events (ms from the request)"] = {
        "server_p50": math.nan, "server_p99": math.nan, "wall_p50": statistics.median(live),
        "wall_p99": p99(live), "size_kib": math.nan, "rss": math.nan}
    results["first request after start"] = {
        "server_p50": cold, "server_p99": cold, "wall_p50": math.nan, "wall_p99": math.nan,
        "size_kib": math.nan, "rss": math.nan}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000])
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    print("| nodes | case | server p50 | server p99 | client p50 | client p99 | page | RSS |\n"
          "|---|---|---|---|---|---|---|---|")
    for count in args.nodes:
        for case, r in run(count, args.requests).items():
            cells = [fmt(r[k], unit) for k, unit in (
                ("server_p50", "ms"), ("server_p99", "ms"), ("wall_p50", "ms"),
                ("wall_p99", "ms"), ("size_kib", "KiB"), ("rss", "MiB"))]
            print(f"| {count:,} | {case} | " + " | ".join(cells) + " |", flush=True)


def fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "–"
    return f"{value:,.0f} {unit}" if unit != "ms" else f"{value:.1f} ms"

if __name__ == "__main__":
    main()
