"""Health findings (issue 24): intake throughput through the API into SQLite, classification
speed of a large kernel log, and the BMC health poll of a 1,000-node fleet (fault at the BMC
to finding, finding to drained, the poll's CPU), the median of ``--runs`` runs each.

    python3 bench/health_bench.py [--runs 3] [--nodes 1000] [--faults 50] [--findings 4000]
                                  [--log-mb 50] [--interval 45]
                                  [--only classify intake ipmi poll]

- **intake**: ``provisioner serve`` on SQLite with ``--nodes`` active nodes (bulk-inserted);
  8 clients ``POST /api/v1/health/findings`` one finding a request: first ``--findings``
  new ones (each opens a row, writes a history row, reaches the ladder's hook; ``[health]
  auto_repair = false`` so the ladder only records it), then the same ones again (each
  updates ``last_seen``/``count``). Findings/s and the daemon's CPU per finding.
- **classify**: ``provisioner.health.classify`` (the CLI's code) on a ``--log-mb`` log made of
  the real kernel-log captures of tests/fixtures/health (XID lines among ordinary ones)
  repeated; MB/s and lines/s.
- **ipmi**: the IPMI side of a poll that finds nothing new: one ipmi_sim BMC read
  ``--ipmi-reads`` times (one Get SEL Info each, in a worker process); CPU per read.
- **poll**: ``BmcHealthPoll`` with its default settings (every ``--interval`` s, 32 BMCs at
  a time) in this process, against ``--nodes`` Redfish BMCs (racks of 40) served by another
  process (the recorded GB200 tray of tests/fixtures/health/redfish/gb200-leak, one tree per
  BMC; ``--tray expand``/``groups``: the same tray offering ``$expand`` or listing its
  detectors' states in ``LeakDetectorGroups``). After a baseline sweep, five sweeps with
  nothing wrong (their CPU is the poll's steady cost). Then ``--faults`` BMCs go bad at
  random moments of one interval, half with a leaking manifold (drained at once, no rung
  can fix it: ``service_required``), half with the system's ``Status.Health`` Critical
  (drained, a power cycle fixes it: the ladder's simulated rung, ``--rung-s`` long, clears
  it at the BMC, the gate passes, ``active`` again); from the same moment ``--flaps`` other BMCs flap (system
  Critical in periods 0 and 2, OK in 1 and 3: one ladder, the second bad period refused
  by the cool-down); once those settle, ``--burst`` nodes of one rack go Critical at once
  (a failed switch: the rack's breaker, 25 % of 40, lets 10 drain and trips). The repair
  ladder runs with the simulated Slurm/Kubernetes of ``provisioner.simulation``; the fleet
  breaker sits just above the faults and flaps.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import asyncio
import http.client
import json
import logging
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _proc

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "health"
TREE = FIXTURES / "redfish" / "gb200-leak"
LEAKY = "Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/" \
        "Chassis_0_LeakDetector_1_Manifold"
LOGS = ("gpud-dmesg-with-xid-119.log", "gpud-pr46-dmesg-ctime-xid13-109.log",
        "gpud-pr1160-pr1174-kmsg-xid-nvlink5.log", "h200-580.159.04-dmesg-nvrm.txt",
        "nvsentinel-155-dmesg-fallen-off-bus.log", "open-gpu-kernel-modules-1150-journal-xid45.log",
        "ml-engineering-xid63.log")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


# -- classify ---------------------------------------------------------------------------------


def bench_classify(megabytes: int) -> dict[str, float]:
    from provisioner.health.classify import classify

    chunk = "".join((FIXTURES / name).read_text() for name in LOGS)
    text = chunk * max(1, megabytes * 1_000_000 // len(chunk))
    started = time.perf_counter()
    findings = classify(text)
    seconds = time.perf_counter() - started
    if not findings:
        raise SystemExit("classify found nothing in the XID logs")
    return {"mb_s": len(text) / 1e6 / seconds, "lines_s": text.count("\n") / seconds,
            "findings": len(findings), "mb": len(text) / 1e6}


# -- intake -----------------------------------------------------------------------------------


def pv(config: Path, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                           *args], check=True, capture_output=True, text=True).stdout


def seed(config: Path, db: Path, count: int) -> list[str]:
    import sqlite3

    pv(config, "db", "upgrade")
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    rows = [(str(uuid.UUID(int=i + 1)), f"gpu-{i:06d}", f"SN{i:08d}", "active", False,
             f"r{i // 40:04d}", "h100", "{}", "[]", 1, 1, now, now) for i in range(count)]
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO node (id, hostname, serial, state, maintenance, rack, profile, facts,"
            " checkpoint, version, history_seq, created_at, updated_at, maintenance_reason,"
            " last_error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,'','')", rows)
    return [row[1] for row in rows]


def post_all(port: int, token: str, bodies: list[bytes], clients: int) -> None:
    def client(part: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        for body in part:
            conn.request("POST", "/api/v1/health/findings", body=body, headers=headers)
            response = conn.getresponse()
            answer = response.read()
            if response.status != 200:
                raise SystemExit(f"intake: {response.status} {answer[:200]!r}")

    threads = [threading.Thread(target=client, args=(bodies[i::clients],))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def bench_intake(nodes: int, findings: int) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="pv-health-bench-"))
    port = free_port()
    config = work / "provisioner.toml"
    config.write_text(f'state_dir = "{work}"\n[api]\nlisten = "127.0.0.1:{port}"\n'
                      '[lifecycle]\nauto_inspect = false\nauto_deploy = false\n'
                      '[health]\nauto_repair = false\n[log]\nlevel = "WARNING"\n')
    names = seed(config, work / "provisioner.sqlite", nodes)
    token = pv(config, "token", "create", "--role", "operator", "--name", "bench").split()[-1]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(work / "notify.sock"))
    notify.settimeout(300)
    proc = subprocess.Popen([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, NOTIFY_SOCKET=str(work / "notify.sock")))
    bodies = [json.dumps({"node": names[i % len(names)], "origin": "external", "findings": [{
        "class": "gpu-memory", "action": "drain", "subject": f"GPU {i // len(names)}",
        "evidence": f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0 on GPU {i // len(names)}"}]}).encode()
        for i in range(findings)]
    result: dict[str, float] = {}
    try:
        while not notify.recv(4096).startswith(b"READY=1"):
            pass
        for phase in ("new", "repeat"):
            cpu, started = _proc.cpu_seconds(proc.pid), time.perf_counter()
            post_all(port, token, bodies, 8)
            seconds = time.perf_counter() - started
            result[f"{phase}_per_s"] = findings / seconds
            result[f"{phase}_cpu_ms"] = \
                (_proc.cpu_seconds(proc.pid) - cpu) * 1000 / findings
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        notify.close()
        shutil.rmtree(work, ignore_errors=True)
    return result


# -- the BMC fleet (another process) ----------------------------------------------------------


def serve_bmcs(port: int, count: int, mode: str, interval_s: float) -> None:
    """``/bmc/<i>/redfish/v1/...``: the GB200 tree for every BMC (``mode`` ``expand``: its
    root offers ``$expand`` as DMTF's catfish does and the detector collection answers it;
    ``groups``: its ``LeakDetection`` lists the detectors' states as DMTF's cooling unit
    does); ``POST /fault/<i>/<kind>``: ``leak`` (the manifold reads LeakDetected),
    ``critical`` (the system's Status.Health Critical), ``flap`` (Critical in every other
    period from now on, for four periods), ``clear`` (the system OK again: a rung fixed it)."""
    from aiohttp import web

    tree = {str(p.parent.relative_to(TREE)).strip("."): json.loads(p.read_bytes())
            for p in TREE.rglob("index.json")}
    ok = tree["Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors/"
              "Chassis_0_LeakDetector_0_ColdPlate"]
    leak, tree[LEAKY] = tree[LEAKY], {**ok, "Id": LEAKY.rsplit("/", 1)[1]}
    detection = "Chassis/Chassis_0/ThermalSubsystem/LeakDetection"
    uris = [m["@odata.id"] for m in tree[f"{detection}/LeakDetectors"]["Members"]]
    if mode == "expand":
        catfish = json.loads((FIXTURES / "redfish" / "dmtf-catfish" / "index.json").read_text())
        tree[""] = {**tree[""], "ProtocolFeaturesSupported": catfish["ProtocolFeaturesSupported"]}
    faults: dict[int, str] = {}
    flap_from: dict[int, float] = {}
    encoded = {path: json.dumps(body).encode() for path, body in tree.items()}

    def detector(path: str, index: int) -> dict[str, Any]:
        return leak if path == LEAKY and faults.get(index) == "leak" else tree[path]

    def body(path: str, query: str, index: int) -> bytes | None:
        system = path == "Systems/System1"
        critical = faults.get(index) == "critical" or (
            index in flap_from and int((time.monotonic() - flap_from[index]) / interval_s)
            in (0, 2))
        if system and critical:
            return json.dumps({**tree[path], "Status": {"State": "Enabled",
                                                        "Health": "Critical"}}).encode()
        if mode == "expand" and path == f"{detection}/LeakDetectors" and "expand" in query:
            members = [{**detector(u.removeprefix("/redfish/v1/"), index), "@odata.id": u}
                       for u in uris]
            return json.dumps({**tree[path], "Members": members}).encode()
        if mode == "groups" and path == detection:
            states = [{"DataSourceUri": u, "DetectorState": detector(
                u.removeprefix("/redfish/v1/"), index)["DetectorState"]} for u in uris]
            return json.dumps({**tree[path], "LeakDetectorGroups": [
                {"GroupName": "Tray", "Detectors": states}]}).encode()
        if path == LEAKY and faults.get(index) == "leak":
            return json.dumps(leak).encode()
        return encoded.get(path)

    async def get(request: web.Request) -> web.Response:
        index = int(request.match_info["i"])
        answer = body(request.match_info["path"].strip("/"), request.query_string, index)
        if answer is None or index >= count:
            raise web.HTTPNotFound()
        return web.Response(body=answer, content_type="application/json")

    async def fault(request: web.Request) -> web.Response:
        index, kind = int(request.match_info["i"]), request.match_info["kind"]
        if kind == "flap":
            flap_from[index] = time.monotonic()
        elif kind == "clear":
            faults.pop(index, None) if faults.get(index) == "critical" else None
        else:
            faults[index] = kind
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/bmc/{i}/redfish/v1{path:.*}", get)
    app.router.add_post("/fault/{i}/{kind}", fault)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def bench_poll(nodes: int, faults: int, interval_s: float, mode: str, flaps: int,
                     burst: int, rung_s: float) -> dict[str, float]:
    logging.getLogger("provisioner").setLevel(logging.ERROR)  # each opening logs a warning
    work = Path(tempfile.mkdtemp(prefix="pv-health-poll-"))
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve-bmcs", str(port), str(nodes),
                               mode, str(interval_s)])
    try:
        return await _poll_fleet(work, port, nodes, faults, interval_s, flaps, burst, rung_s)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)


class _Alerts(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.tripped = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.tripped += "circuit breaker tripped" in record.getMessage()


async def _poll_fleet(work: Path, port: int, nodes: int, faults: int, interval_s: float,
                      flaps: int, burst: int, rung_s: float) -> dict[str, float]:
    from provisioner.bmc.managed import BmcManager
    from provisioner.bmc.redfish import RedfishDriver
    from provisioner.bmc.registry import BmcRegistry
    from provisioner.config import BmcSettings, LifecycleSettings, Settings
    from provisioner.config.health import HealthSettings
    from provisioner.domain import BmcEndpoint, NewNode
    from provisioner.health.records import Change, FindingRecord
    from provisioner.lifecycle.bmc_health import BmcHealthPoll
    from provisioner.lifecycle.conductor import Conductor
    from provisioner.lifecycle.health import HealthFindings
    from provisioner.lifecycle.repair import RepairService, ladder_listener
    from provisioner.lifecycle.states import NodeState
    from provisioner.bmc.fake import fake_bmc_factory
    from provisioner.lifecycle.ports import Ports
    from provisioner.simulation.drivers import (
        FakeInspector,
        FakeInstaller,
        FakeKube,
        FakeRepairs,
        FakeSlurm,
        FakeValidator,
    )
    from provisioner.simulation.world import SimWorld
    from provisioner.store.store import open_store

    store = open_store(Settings(state_dir=work / "state"), migrate=True)
    world = SimWorld(work / "world.sqlite")
    opened: dict[str, float] = {}
    drained: dict[str, list[float]] = {}
    index_of: dict[str, int] = {}

    def post(index: int, kind: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", f"/fault/{index}/{kind}")
        conn.getresponse().read()

    class TimedRepairs:
        """The simulated Slurm/Kubernetes drains, timed; a rung takes ``rung_s`` and fixes
        the machine (its BMC's system reads OK again)."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        async def drain(self, node: Any, reason: str, wait_jobs_s: float) -> str:
            result: str = await self._inner.drain(node, reason, wait_jobs_s)
            drained.setdefault(node.id, []).append(time.monotonic())
            return result

        async def _fix(self, rung: str, node: Any) -> None:
            await asyncio.sleep(rung_s)
            await asyncio.to_thread(post, index_of[node.id], "clear")
            await getattr(self._inner, rung)(node)

        async def reset_gpus(self, node: Any) -> None:
            await self._fix("reset_gpus", node)

        async def restart_os(self, node: Any) -> None:
            await self._fix("restart_os", node)

        async def wait_os(self, node: Any) -> None:
            await self._fix("wait_os", node)

    # the simulated machines of tests/conftest.py's fake_ports (not imported: it turns on
    # asyncio's debug mode, which would be measured too)
    kw: dict[str, Any] = {"delay_s": 0.0, "fail_rate": 0.0}
    ports = Ports(bmc=fake_bmc_factory(world), inspector=FakeInspector(world, **kw),
                  installer=FakeInstaller(world, **kw), kube=FakeKube(world, **kw),
                  slurm=FakeSlurm(world, **kw), validator=FakeValidator(world, **kw),
                  repairs=TimedRepairs(FakeRepairs(world, **kw)))
    conductor = Conductor(store.nodes, ports, LifecycleSettings(auto_inspect=False,
                                                                auto_deploy=False))
    # the fleet breaker above the faults and flaps; the burst trips its rack's (25 %)
    settings = HealthSettings(max_repairing_fraction=(faults + flaps) / nodes + 0.03,
                              bmc_poll_interval_s=interval_s)
    health = HealthFindings(store.findings, conductor)

    async def on_finding(record: FindingRecord, change: Change) -> None:
        if change is Change.OPENED:
            opened.setdefault(record.node_id, time.monotonic())

    repair = RepairService(conductor, store.nodes, settings)
    health.add_listener(on_finding)
    health.add_listener(ladder_listener(repair))
    alerts = _Alerts()
    logging.getLogger("provisioner").addHandler(alerts)
    driver = RedfishDriver(timeout_s=10)
    bmcs = BmcManager(BmcRegistry({"redfish": driver}), BmcSettings())
    ids = []
    for i in range(nodes):
        node = await store.nodes.create(NewNode(
            state=NodeState.ACTIVE, hostname=f"gpu-{i:05d}", serial=f"SN{i:06d}",
            rack=f"r{i // 40:03d}",
            bmc=BmcEndpoint("redfish", f"http://127.0.0.1:{port}/bmc/{i}", username="admin"),
            bmc_password="pw"), actor="bench")
        ids.append(node.id)
        index_of[node.id] = i
    poll = BmcHealthPoll(store.nodes, health, bmcs, settings)

    async def states(indexes: list[int]) -> list[NodeState]:
        return [NodeState((await store.nodes.get(ids[i])).state) for i in indexes]

    try:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                await asyncio.sleep(0.1)
        first = await poll.sweep()  # baseline: discovery, cursors written
        assert first.read == nodes, first
        await asyncio.sleep(max(0.0, interval_s - first.seconds))
        sweeps_cpu = []  # nothing wrong: the steady cost, 5 sweeps (the machine is shared:
        for _ in range(5):  # the least is the poll's own, the median what it got here)
            cpu = time.process_time()
            steady = await poll.sweep()
            sweeps_cpu.append(time.process_time() - cpu)
            assert steady.read == nodes and not steady.reported, steady
        steady_cpu = statistics.median(sweeps_cpu)
        await asyncio.sleep(interval_s)
        burst_rack = list(range(nodes - nodes % 40 - 40, nodes - nodes % 40))[:burst]
        chosen = random.sample(range(nodes - nodes % 40 - 40), faults + flaps)
        faulty, flapping = chosen[:faults], chosen[faults:]
        leaks, repairable = faulty[: faults // 2], faulty[faults // 2:]
        moments = sorted(random.uniform(0, interval_s) for _ in faulty)
        injected: dict[str, float] = {}
        run = asyncio.get_running_loop().create_task(poll.run())
        start = time.monotonic()
        for index in flapping:
            await asyncio.to_thread(post, index, "flap")
        for index, moment in zip(faulty, moments, strict=True):
            await asyncio.sleep(max(0.0, start + moment - time.monotonic()))
            await asyncio.to_thread(post, index, "leak" if index in leaks else "critical")
            injected[ids[index]] = time.monotonic()
        async with asyncio.timeout(6 * interval_s + 120):
            while len(set(drained) & set(injected)) < faults or any(
                    s is not NodeState.ACTIVE for s in await states(repairable)):
                await asyncio.sleep(0.2)
        # the flaps' four periods are over before the burst
        await asyncio.sleep(max(0.0, start + 4.5 * interval_s - time.monotonic()))
        before_burst = set(drained)
        for index in burst_rack:  # a failed switch: most of one rack at once
            await asyncio.to_thread(post, index, "critical")
        await asyncio.sleep(2 * interval_s)
        run.cancel()
        breaker = repair.breaker_state()
        marked = set(faulty) | set(flapping) | set(burst_rack)
        healthy_drained = sum(1 for i in range(nodes) if i not in marked and ids[i] in drained)
        flap_starts = [len(drained.get(ids[i], [])) for i in flapping]
        flap_refused = 0  # flapping nodes whose sensor went bad again and were refused
        for i in flapping:
            flap_refused += any(h.event == "repair_held" and "cooldown_s" in h.reason
                                for h in await store.nodes.history(ids[i]))
        back = sum(s is NodeState.ACTIVE for s in await states(repairable))
        leak_states = await states(leaks)
        burst_drained = sum(1 for i in burst_rack if ids[i] in drained
                            and ids[i] not in before_burst)
    finally:
        logging.getLogger("provisioner").removeHandler(alerts)
        await conductor.stop()
        await driver.aclose()
        store.close()
        world.close()
    detect = [opened[n] - injected[n] for n in injected]
    drain = [drained[n][0] - opened[n] for n in injected]
    return {"detect_p50": statistics.median(detect), "detect_p99": pct(detect, 0.99),
            "drain_p50": statistics.median(drain), "drain_p99": pct(drain, 0.99),
            "sweep_s": steady.seconds, "core_pct": steady_cpu / interval_s * 100,
            "cpu_ms_node": steady_cpu * 1000 / nodes,
            "cpu_ms_node_min": min(sweeps_cpu) * 1000 / nodes, "healthy_drained": healthy_drained,
            "faulted_drained": len(set(drained) & set(injected)),
            "repairable": len(repairable), "repaired_active": back,
            "leaks_service_required": sum(s is NodeState.SERVICE_REQUIRED for s in leak_states),
            "flaps": len(flapping), "flap_ladders_max": max(flap_starts, default=0),
            "flap_ladders": sum(flap_starts), "flap_refused": flap_refused, "burst": len(burst_rack),
            "burst_drained": burst_drained, "breaker_open": float(breaker.tripped),
            "breaker_held": len(breaker.held), "breaker_alerts": alerts.tripped}


async def bench_ipmi(reads: int) -> dict[str, float]:
    """One ipmi_sim BMC read ``reads`` times in a row as the poll reads an unchanged SEL
    (one Get SEL Info through a worker process): CPU per read, this process and the
    worker's together."""
    from provisioner.bmc.ipmi import IpmiDriver
    from provisioner.bmc.ipmi_pool import IpmiWorkers
    from provisioner.bmc.managed import BmcManager
    from provisioner.bmc.registry import BmcRegistry
    from provisioner.config import BmcSettings
    from provisioner.domain import BmcCredentials, BmcEndpoint
    from tests.peers.ipmi_sim import PASSWORD, USER, running_ipmi_sim

    work = Path(tempfile.mkdtemp(prefix="pv-health-ipmi-"))
    workers = IpmiWorkers(count=1, threads=4)
    driver = IpmiDriver(workers, timeout_s=5)
    try:
        with running_ipmi_sim(work / "bmc", console=True) as sim:
            bmc = BmcManager(BmcRegistry({"ipmi": driver}), BmcSettings())(
                "n1", BmcEndpoint("ipmi", "127.0.0.1", sim.port, username=USER),
                BmcCredentials(USER, PASSWORD))
            cursor = (await bmc.read_health(None)).cursor  # login, baseline
            worker = workers.pid(0)
            assert worker is not None
            cpu, worker_cpu = time.process_time(), _proc.cpu_seconds(worker)
            started = time.perf_counter()
            for _ in range(reads):
                reading = await bmc.read_health(cursor)
                assert not reading.events and reading.cursor == cursor
            seconds = time.perf_counter() - started
            ours, theirs = time.process_time() - cpu, _proc.cpu_seconds(worker) - worker_cpu
    finally:
        await driver.aclose()
        await workers.aclose()
        shutil.rmtree(work, ignore_errors=True)
    return {"ms_read": seconds * 1000 / reads, "cpu_ms": (ours + theirs) * 1000 / reads,
            "worker_cpu_ms": theirs * 1000 / reads}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--serve-bmcs":
        serve_bmcs(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--findings", type=int, default=4000)
    parser.add_argument("--log-mb", type=int, default=50)
    parser.add_argument("--interval", type=float, default=45.0,
                        help="the BMC poll period (the default of [health] bmc_poll_interval_s)")
    parser.add_argument("--ipmi-reads", type=int, default=500)
    parser.add_argument("--flaps", type=int, default=20)
    parser.add_argument("--burst", type=int, default=16, help="nodes of one rack (of 40)")
    parser.add_argument("--rung-s", type=float, default=10.0,
                        help="how long a simulated rung takes (a real power cycle: minutes)")
    parser.add_argument("--tray", choices=("recorded", "expand", "groups"), default="recorded",
                        help="how the BMCs' trays answer (see serve_bmcs)")
    parser.add_argument("--only", nargs="+", default=["classify", "intake", "ipmi", "poll"])
    args = parser.parse_args()
    if "classify" in args.only:
        c = median_of([bench_classify(args.log_mb) for _ in range(args.runs)])
        print(f"classify: {c['mb']:.0f} MB of kernel log, median of {args.runs}: "
              f"{c['mb_s']:.1f} MB/s, {c['lines_s']:,.0f} lines/s, {c['findings']:.0f} "
              "findings", flush=True)
    if "intake" in args.only:
        i = median_of([bench_intake(args.nodes, args.findings) for _ in range(args.runs)])
        print(f"intake: {args.findings} findings on {args.nodes} nodes, 8 clients, median of "
              f"{args.runs}: new {i['new_per_s']:.0f}/s ({i['new_cpu_ms']:.2f} ms daemon CPU "
              f"each), repeats {i['repeat_per_s']:.0f}/s ({i['repeat_cpu_ms']:.2f} ms)",
              flush=True)
    if "ipmi" in args.only:
        m = median_of([asyncio.run(bench_ipmi(args.ipmi_reads)) for _ in range(args.runs)])
        print(f"ipmi: {args.ipmi_reads} reads of an unchanged SEL (ipmi_sim), median of "
              f"{args.runs}: {m['ms_read']:.2f} ms each, {m['cpu_ms']:.2f} ms CPU each "
              f"({m['worker_cpu_ms']:.2f} in the worker process)", flush=True)
    if "poll" in args.only:
        runs = [asyncio.run(bench_poll(args.nodes, args.faults, args.interval, args.tray,
                                       args.flaps, args.burst, args.rung_s))
                for _ in range(args.runs)]
        p = median_of(runs)
        print(f"poll: {args.nodes} Redfish BMCs ({args.tray} tray) every {args.interval:g} s, "
              f"{args.faults} faults (half leaks, half system Critical), median of "
              f"{args.runs}: fault->finding p50 {p['detect_p50']:.1f} s p99 "
              f"{p['detect_p99']:.1f} s; finding->drained p50 {p['drain_p50'] * 1000:.0f} ms "
              f"p99 {p['drain_p99'] * 1000:.0f} ms; a sweep {p['sweep_s']:.1f} s, "
              f"{p['cpu_ms_node']:.2f} ms CPU per node per period (least of 5 sweeps "
              f"{p['cpu_ms_node_min']:.2f}) = {p['core_pct']:.2f} % of one core; healthy drained {p['healthy_drained']:.0f}, faulty drained "
              f"{p['faulted_drained']:.0f}/{args.faults}; repairable back in active "
              f"{p['repaired_active']:.0f}/{p['repairable']:.0f}, leaks in service_required "
              f"{p['leaks_service_required']:.0f}; {p['flaps']:.0f} flapping sensors: "
              f"{p['flap_ladders']:.0f} ladders, at most {p['flap_ladders_max']:.0f} a node, "
              f"{p['flap_refused']:.0f} bad again and refused (cool-down); "
              f"burst of {p['burst']:.0f} in one rack: {p['burst_drained']:.0f} drained, "
              f"breaker open {bool(p['breaker_open'])}, {p['breaker_held']:.0f} held, "
              f"{p['breaker_alerts']:.0f} breaker alert(s)", flush=True)
        for run in runs:
            print("  run:", {k: round(v, 3) for k, v in run.items()})


if __name__ == "__main__":
    main()
