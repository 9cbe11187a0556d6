"""BMC: power-state sweep of 1,000 simulated BMCs through the daemon's own drivers.

IPMI: pyghmi's server-side ``Bmc`` class (tests/sim/ipmi_bmc.py, ``--ipmi-per-process``
BMCs per process, one UDP port each) answers every IPMI command after an injected latency
(200 ms); the daemon's ``ipmi`` driver sweeps them through ``BmcManager`` (limits, breaker,
retries) in its "bmc" pool. Cold sweep = login + first read; warm = the sessions reused.
Leaked sessions = sessions the simulators saw opened minus closed after the driver's
``aclose`` (logout), plus any BMC that got more than one session.

Redfish: tests/sim/redfish.py (aiohttp, 1,000 BMCs on loopback ports in one process, 2 s
per request, SessionService) swept by the ``redfish`` driver; it reports the most requests
it ever had in flight on one BMC. sushy-tools is one process serving every system behind one
port with real work per request, so it cannot emulate 1,000 BMCs at 2 s each.

Run from the repository root:  python3 bench/bmc_bench.py [--bmcs 1000]
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provisioner.bmc.ipmi import IpmiDriver  # noqa: E402
from provisioner.bmc.ipmi_pool import IpmiWorkers  # noqa: E402
from provisioner.bmc.managed import BmcManager  # noqa: E402
from provisioner.bmc.redfish import RedfishDriver  # noqa: E402
from provisioner.bmc.registry import BmcRegistry  # noqa: E402
from provisioner.config import BmcSettings  # noqa: E402
from provisioner.domain import BmcCredentials, BmcEndpoint  # noqa: E402
from tests.sim.ipmi_bmc import SimBmcs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


async def sweep(manager: BmcManager, endpoints: list[BmcEndpoint],
                creds: BmcCredentials) -> tuple[float, int]:
    started = time.perf_counter()
    results = await asyncio.gather(*(manager(f"n{i}", ep, creds).power_state()
                                     for i, ep in enumerate(endpoints)),
                                   return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    for error in failed[:3]:
        print(f"  failed: {error}", file=sys.stderr)
    return time.perf_counter() - started, len(failed)


async def bench_ipmi(count: int, latency_ms: float, threads: int,
                     per_process: int) -> dict[str, Any]:
    settings = BmcSettings(max_concurrency=threads, timeout_s=10, retries=2,
                           retry_backoff_s=0.2)
    with SimBmcs(count=count, latency_ms=latency_ms, per_process=per_process) as sim:
        workers = IpmiWorkers(count=settings.ipmi_workers,
                              threads=max(1, threads // settings.ipmi_workers))
        ipmi = IpmiDriver(workers, timeout_s=settings.timeout_s)
        manager = BmcManager(BmcRegistry({"ipmi": ipmi}, closers=[ipmi.aclose]), settings)
        endpoints = [BmcEndpoint("ipmi", sim.address, port=p) for p in sim.ports]
        creds = BmcCredentials(sim.user, sim.password)
        cold_s, cold_failed = await sweep(manager, endpoints, creds)
        warm_s, warm_failed = await sweep(manager, endpoints, creds)
        during = sim.stats()
        await manager.aclose()
        after = sim.stats()
    opened = sum(s["opened"] for s in after.values())
    closed = sum(s["closed"] for s in after.values())
    return {"bmcs": count, "latency_ms": latency_ms, "threads": threads,
            "cold_s": round(cold_s, 2), "warm_s": round(warm_s, 2),
            "failed": cold_failed + warm_failed,
            "max_sessions_per_bmc": max(s["opened"] for s in during.values()),
            "sessions_opened": opened, "leaked_sessions": opened - closed,
            "max_in_flight_per_bmc": manager.limiter.max_in_flight}


async def bench_redfish(count: int, latency_s: float, concurrency: int) -> dict[str, Any]:
    settings = BmcSettings(max_concurrency=concurrency, timeout_s=30, retries=2)
    proc = subprocess.Popen([sys.executable, "-m", "tests.sim.redfish", "--count", str(count),  # noqa: ASYNC220
                             "--latency-s", str(latency_s)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        info = json.loads(proc.stdout.readline() if proc.stdout else "{}")
        redfish = RedfishDriver(timeout_s=settings.timeout_s)
        manager = BmcManager(BmcRegistry({"redfish": redfish}, closers=[redfish.aclose]),
                             settings)
        endpoints = [BmcEndpoint("redfish", f"http://127.0.0.1:{p}") for p in info["ports"]]
        creds = BmcCredentials("admin", "password")
        cold_s, cold_failed = await sweep(manager, endpoints, creds)
        warm_s, warm_failed = await sweep(manager, endpoints, creds)
        await manager.aclose()
        stats = await asyncio.to_thread(_get_json,
                                        f"http://127.0.0.1:{info['control']}/stats")
    finally:
        proc.terminate()
        proc.wait(10)
    return {"bmcs": count, "latency_s": latency_s, "concurrency": concurrency,
            "cold_s": round(cold_s, 2), "warm_s": round(warm_s, 2),
            "failed": cold_failed + warm_failed, "logins": stats["logins"],
            "leaked_sessions": stats["live_sessions"],
            "max_in_flight_per_bmc": stats["max_in_flight_per_bmc"]}


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bmcs", type=int, default=1000)
    parser.add_argument("--ipmi-latency-ms", type=float, default=200.0)
    parser.add_argument("--ipmi-threads", type=int, default=128,
                        help="IPMI calls in flight, over all worker processes")
    parser.add_argument("--ipmi-per-process", type=int, default=50)
    parser.add_argument("--redfish-latency-s", type=float, default=2.0)
    parser.add_argument("--redfish-concurrency", type=int, default=1000)
    parser.add_argument("--only", choices=("ipmi", "redfish"))
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    results: dict[str, Any] = {}
    if args.only in (None, "ipmi"):
        results["ipmi"] = asyncio.run(bench_ipmi(args.bmcs, args.ipmi_latency_ms,
                                                 args.ipmi_threads, args.ipmi_per_process))
        print("ipmi", json.dumps(results["ipmi"]), flush=True)
    if args.only in (None, "redfish"):
        results["redfish"] = asyncio.run(bench_redfish(args.bmcs, args.redfish_latency_s,
                                                       args.redfish_concurrency))
        print("redfish", json.dumps(results["redfish"]), flush=True)
    ok = all(r["failed"] == 0 and r["leaked_sessions"] == 0 and r["max_in_flight_per_bmc"] <= 1
             for r in results.values())
    ok = ok and results.get("ipmi", {}).get("cold_s", 0) <= 10
    ok = ok and results.get("redfish", {}).get("cold_s", 0) <= 60
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
