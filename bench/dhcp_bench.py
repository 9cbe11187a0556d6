"""DHCP leases/s with Kea's perfdhcp: the daemon vs dnsmasq vs Kea, in the same run.

``--rounds`` (3) rounds, interleaved: each round runs every server in turn (ours, theirs,
ours, …); each round's ratios are taken within it, and the bench prints every round's ratio
and the median with its spread (min–max); the table shows the medians.

Two network namespaces joined by a veth pair (server 10.77.0.1/16, perfdhcp 10.77.0.2/16, a
relay as far as the servers can tell); each server in turn gets a rate sweep (DORA exchanges
per second, each step ``--seconds`` long) and the best rate whose DISCOVER-OFFER and
REQUEST-ACK drops both stay at or below 2.5 % is its score; then, ``--settle`` seconds
after the sweep's last step (which overloaded it), a burst of ``--burst`` clients at once. The daemon runs for real (``provisioner serve`` with its SQLite store,
discovery inventory and leases), at log level WARNING like dnsmasq's ``quiet-dhcp``: with
the shipped ``dhcp.workers`` default (the daemon's loop and one worker process per CPU less
one, at most 4: on 2 CPUs, the loop and one process), and with ``--workers N`` once more
with ``dhcp.workers = N`` (0: the daemon's loop alone).

Run as root from the repository root:  python3 bench/dhcp_bench.py
Needs: kea-admin (perfdhcp), kea-dhcp4-server, dnsmasq-base. Stops every process it starts
and deletes its namespaces. Traffic stays inside the namespaces.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import _rounds
from _netns import stop, veth_pair, wait_listening

ROOT = Path(__file__).resolve().parents[1]
SERVER, CLIENT = "10.77.0.1", "10.77.0.2"
POOL_FIRST, POOL_LAST = "10.77.1.0", "10.77.255.254"
MAX_DROPS_PCT = 2.5


@contextmanager
def namespaces() -> Iterator[tuple[str, str]]:
    with veth_pair("b", SERVER, CLIENT) as pair:
        yield pair


@dataclass
class Result:
    rate: int
    discover_drops: float
    request_drops: float
    acks: int
    seconds: float
    avg_delay_ms: float

    @property
    def ok(self) -> bool:
        return max(self.discover_drops, self.request_drops) <= MAX_DROPS_PCT

    @property
    def leases_per_s(self) -> float:
        return self.acks / self.seconds


def perfdhcp(cli: str, rate: int, seconds: float, clients: int, count: int | None = None) -> Result:
    args = ["ip", "netns", "exec", cli, "perfdhcp", "-4", "-l", CLIENT, "-r", str(rate), "-R",
            str(clients), "-W", "1000000"]
    args += ["-n", str(count)] if count is not None else ["-p", str(int(seconds))]
    out = subprocess.run([*args, SERVER], capture_output=True, text=True,
                         timeout=seconds + 60).stdout
    sections = out.split("***Statistics for: ")
    stats = [dict(re.findall(r"^([a-z ]+): ([\d.]+)", s, re.M)) for s in sections[1:3]]
    if not stats:
        raise RuntimeError(f"perfdhcp printed no statistics:\n{out}")
    while len(stats) < 2:  # no OFFER came back: perfdhcp sent no REQUEST at all
        stats.append({})
    return Result(rate, float(stats[0].get("drops ratio", "100")),
                  float(stats[1].get("drops ratio", "100")),
                  int(stats[1].get("received packets", "0")), seconds,
                  float(stats[1].get("avg delay", "0")))


def wait_port(ns: str, port: int = 67, timeout_s: float = 20.0) -> None:
    wait_listening(ns, "u", port, timeout_s)


def start_ours(ns: str, d: Path, workers: int | None = None) -> subprocess.Popen[bytes]:
    """``provisioner serve``; ``workers``: its ``dhcp.workers`` (None: the default)."""
    config = d / "provisioner.toml"
    config.write_text(f"""state_dir = "{d / 'state'}"
[api]
listen = "127.0.0.1:18700"
[dhcp]
mode = "authoritative"
interface = "vs0"
server_address = "{SERVER}"
pool = "{POOL_FIRST}-{POOL_LAST}"
netmask = "255.255.0.0"
{f"workers = {workers}" if workers is not None else ""}
[http]
listen = "{SERVER}:18080"
[log]
level = "WARNING"
""")
    exe = Path(sys.executable).parent / "provisioner"
    log = (d / "provisioner.log").open("wb")
    return subprocess.Popen(["ip", "netns", "exec", ns, str(exe), "--config", str(config),
                             "serve"], stdout=log, stderr=subprocess.STDOUT)


class _NoNodes:
    """Inventory for --serve-dhcp-only: every MAC unknown, nothing recorded."""

    async def lookup(self, mac: str) -> None:
        return None

    async def unknown_mac_booted(self, mac: str, client: str) -> None:
        return None


def serve_dhcp_only(d: Path) -> None:
    """The DHCP server alone (real LeaseRepo on SQLite in ``d``, on the store's boot threads
    and with the daemon's collector settings, as in ``provisioner serve``), until SIGTERM."""
    import asyncio
    import signal

    from provisioner.boot.dhcp import DhcpServer
    from provisioner.config import BootSettings, DhcpSettings, Settings
    from provisioner.gc_tuning import tune_gc
    from provisioner.store.leases import LeaseRepo
    from provisioner.store.store import open_store

    async def run() -> None:
        store = open_store(Settings(state_dir=d / "state"))
        settings = DhcpSettings(mode="authoritative", interface="vs0", server_address=SERVER,
                                pool=f"{POOL_FIRST}-{POOL_LAST}", netmask="255.255.0.0")
        server = DhcpServer(settings, BootSettings(), http_base_url=f"http://{SERVER}:8080",
                            inventory=_NoNodes(), leases=LeaseRepo(store.engine, store.boot_pool))
        await server.start()
        tune_gc()  # as the daemon does once started
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await stopping.wait()
        await server.stop()
        store.close()

    asyncio.run(run())


def start_dhcp_only(ns: str, d: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__,
                             "--serve-dhcp-only", str(d)])


def start_dnsmasq(ns: str, d: Path, leasefile: bool) -> subprocess.Popen[bytes]:
    lease = f"--dhcp-leasefile={d / 'dnsmasq.leases'}" if leasefile else "--leasefile-ro"
    return subprocess.Popen([
        "ip", "netns", "exec", ns, "dnsmasq", "-k", "--port=0", "--interface=vs0",
        "--bind-interfaces", "--dhcp-authoritative", "--user=root", "--no-ping",
        f"--dhcp-range={POOL_FIRST},{POOL_LAST},255.255.0.0,1h", "--dhcp-lease-max=100000",
        lease, "--quiet-dhcp", f"--log-facility={d / 'dnsmasq.log'}"])


def start_kea(ns: str, d: Path) -> subprocess.Popen[bytes]:
    config = {"Dhcp4": {
        "interfaces-config": {"interfaces": ["vs0"], "dhcp-socket-type": "udp"},
        "lease-database": {"type": "memfile", "persist": True, "name": str(d / "leases4.csv"),
                           "lfc-interval": 0},
        "multi-threading": {"enable-multi-threading": False}, "valid-lifetime": 3600,
        "subnet4": [{"id": 1, "subnet": "10.77.0.0/16",
                     "pools": [{"pool": f"{POOL_FIRST} - {POOL_LAST}"}]}],
        "loggers": [{"name": "kea-dhcp4", "output_options": [{"output": "stdout"}],
                     "severity": "WARN"}]}}
    (d / "kea4.json").write_text(json.dumps(config))
    return subprocess.Popen(["ip", "netns", "exec", ns, "env", f"KEA_PIDFILE_DIR={d}",
                             f"KEA_LOCKFILE_DIR={d}", "kea-dhcp4", "-c", str(d / "kea4.json")],
                            stdout=subprocess.DEVNULL)


@dataclass
class Score:
    name: str
    best: Result | None
    burst: Result
    sweep: list[Result]


def measure(name: str, start: Callable[[Path], subprocess.Popen[bytes]], srv: str, cli: str,
            args: argparse.Namespace) -> Score:
    with tempfile.TemporaryDirectory(prefix="dhcpbench") as tmp:
        proc = start(Path(tmp))
        try:
            wait_port(srv)
            time.sleep(1.0)
            perfdhcp(cli, 100, 2, 100)  # warm-up (first leases, caches)
            sweep: list[Result] = []
            for rate in args.rates:
                result = perfdhcp(cli, rate, args.seconds, args.clients)
                sweep.append(result)
                print(f"{name:18} rate {rate:5}/s: drops {result.discover_drops:5.2f} % / "
                      f"{result.request_drops:5.2f} %, {result.leases_per_s:7.0f} leases/s, "
                      f"avg {result.avg_delay_ms:.1f} ms", file=sys.stderr)
                if len([r for r in sweep if not r.ok]) >= 2:
                    break
            time.sleep(args.settle)  # the sweep's last step overloaded it: let that drain
            burst = perfdhcp(cli, 5 * args.burst, 1, args.burst, count=args.burst)
            print(f"{name:18} burst {args.burst}: drops {burst.discover_drops:.2f} % / "
                  f"{burst.request_drops:.2f} %", file=sys.stderr)
        finally:
            stop(proc)
    passing = [r for r in sweep if r.ok]
    best = max(passing, key=lambda r: r.leases_per_s) if passing else None
    return Score(name, best, burst, sweep)


REFERENCES = ("dnsmasq (leasefile-ro)", "Kea (memfile, 1 thread)")


def rate(score: Score | None) -> float:
    return score.best.leases_per_s if score is not None and score.best else float("nan")


def by_name(scores: list[Score], name: str) -> Score | None:
    return next((s for s in scores if s.name == name), None)


def report(rounds: list[list[Score]]) -> str:
    """One row a server: the median over the rounds of its best rate, leases/s and delay, its
    ratios to the references as the median of each round's ratio (ours and theirs measured
    in the same round), the worst burst; then every round's ratio and the spread."""
    names = [s.name for s in rounds[0]]
    per = {n: [s for r in rounds if (s := by_name(r, n)) is not None] for n in names}
    ratios = {(n, k): [_rounds.ratio(rate(by_name(r, n)), rate(by_name(r, k))) for r in rounds]
              for n in names for k in REFERENCES}
    lines = [f"{len(rounds)} round(s), interleaved: "
             + ", ".join(names) + ", then again; medians over the rounds.", "",
             "| server | best rate at ≤ 2.5 % drops | leases/s | avg delay | vs dnsmasq "
             "(leasefile-ro) | vs Kea | 1,000-client burst drops |",
             "|---|---|---|---|---|---|---|"]
    for n in names:
        scores = per[n]
        best = [s.best.rate for s in scores if s.best]
        delay = _rounds.median([s.best.avg_delay_ms for s in scores if s.best])
        worst = max(scores, key=lambda s: max(s.burst.discover_drops, s.burst.request_drops))
        lines.append(
            f"| {n} | {f'{statistics.median(best):.0f}' if best else '—'}/s | "
            f"{_rounds.median([rate(s) for s in scores]):.0f} | {delay:.1f} ms | "
            f"{_rounds.cell(_rounds.median(ratios[n, REFERENCES[0]]))} | "
            f"{_rounds.cell(_rounds.median(ratios[n, REFERENCES[1]]))} | "
            f"{worst.burst.discover_drops:.1f} % / {worst.burst.request_drops:.1f} % |")
    lines.append("")
    lines.append("leases/s per round: " + "; ".join(
        f"{n} " + ", ".join(f"{rate(s):.0f}" for s in per[n]) for n in names))
    lines += [_rounds.summary(f"{n} vs {k}", ratios[n, k])
              for n in names if n not in REFERENCES for k in REFERENCES if k in names]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=lambda t: [int(x) for x in t.split(",")],
                        default=[250, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 5000, 6000, 8000, 10000])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=20000)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds between the sweep's last (overloaded) step and the "
                             "burst: the burst is new clients at a server that is idle")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds; each runs every server in turn (ours, theirs, …)")
    parser.add_argument("--only", default="", help="run only servers whose name contains "
                        "this (several: comma-separated)")
    parser.add_argument("--workers", type=int, default=None,
                        help="add a row 'provisioner serve (dhcp.workers = N)' beside the "
                             "default's (0: the daemon's loop alone)")
    parser.add_argument("--serve-dhcp-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_dhcp_only is not None:
        serve_dhcp_only(args.serve_dhcp_only)
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    servers: list[tuple[str, Callable[[str, Path], subprocess.Popen[bytes]]]] = [
        ("provisioner serve", start_ours),
        *([(f"provisioner serve (dhcp.workers = {args.workers})",
            lambda ns, d: start_ours(ns, d, args.workers))] if args.workers is not None
          else []),
        ("DhcpServer alone", start_dhcp_only),
        ("dnsmasq (leasefile-ro)", lambda ns, d: start_dnsmasq(ns, d, leasefile=False)),
        ("dnsmasq (lease file)", lambda ns, d: start_dnsmasq(ns, d, leasefile=True)),
        ("Kea (memfile, 1 thread)", start_kea),
    ]
    wanted = args.only.split(",")
    servers = [(name, fn) for name, fn in servers if any(w in name for w in wanted)]
    rounds: list[list[Score]] = []
    with namespaces() as (srv, cli):
        for k in range(args.rounds):
            print(f"round {k + 1} of {args.rounds}", file=sys.stderr)
            rounds.append([measure(name, lambda d, f=fn: f(srv, d), srv, cli, args)
                           for name, fn in servers])
    print(report(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
