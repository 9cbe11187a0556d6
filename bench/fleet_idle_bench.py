"""A fleet at rest: N ``active`` nodes held by one daemon with every periodic duty on, measuring
what keeping them costs (issue 29: <= 5 % of one core for 10,000 nodes, 0 database writes for
nodes where nothing changed, RSS that does not grow).

    python3 bench/fleet_idle_bench.py [--nodes 10000] [--duration-s 600] [--no-peers]
        [--profile FILE]

The nodes are written straight into a migrated SQLite store (a bulk insert, as the API bench
does), ``active``, powered on, each with a simulated BMC (the ``fake`` driver on the daemon's
SimWorld, its machine on too) and an encrypted BMC password. The daemon then runs its duties at
their default periods: power-state sync (``bmc.power_sync_interval_s``), topology recomputation,
expiry sweeps, history retention, and, when the peers can start here (``tests/peers``: root
for slurmctld, the built kube-apiserver/etcd/kwok), the Kubernetes sync against kwok Nodes
carrying each node's id and the Slurm drain sync against a slurmctld knowing every node.

Reported: the daemon's CPU as a share of one core (from ``/proc``), its RSS sampled over the
run, database row writes per minute (SQLite triggers the bench adds count every row inserted,
updated or deleted, per table: node-scoped tables apart from the daemons' own bookkeeping of
heartbeats and leads), and BMC calls per node per hour (the SimWorld's reads and writes).
``--profile FILE`` samples the daemon's every thread with py-spy over the measured window
(collapsed stacks; ``bench/profile_top.py FILE`` prints the top entries).
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import _profile
import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from bench.rack_bench import free_port, rss_mib
from provisioner.config import SimulationSettings
from provisioner.kube.model import LABEL_NODE_ID
from provisioner.simulation.drivers import simulated_facts
from provisioner.simulation.rack import simulated_nodes
from provisioner.store.secretbox import SecretBox

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BOOKKEEPING = {"instance", "singleton", "bench_writes"}  # per daemon, not per node


def cpu_seconds(pid: int) -> tuple[float, float]:
    """The daemon's own CPU, and that of the commands it ran and waited for (scontrol)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    own = sum(int(f) for f in fields[11:13]) / CLOCK_TICKS  # utime stime
    return own, sum(int(f) for f in fields[13:15]) / CLOCK_TICKS  # cutime cstime


def seed(python: str, config: Path, state: Path, count: int) -> list[tuple[str, str]]:
    """Write ``count`` active simulated nodes (with the facts an inspection of them records)
    and their powered-on machines; add the write counters. Returns (node id, hostname)."""
    subprocess.run([python, "-m", "provisioner", "--config", str(config), "db", "upgrade"],
                   check=True, capture_output=True)
    box = SecretBox.from_key_file(state / "secret.key")
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    sim = SimulationSettings(nodes=count, racks=max(1, count // 40))
    rows, macs, machines, names = [], [], [], []
    for i, new in enumerate(simulated_nodes(sim)):
        node_id = str(uuid.UUID(int=i + 1))
        assert new.bmc is not None
        rows.append((node_id, new.hostname, new.serial, "active", new.rack, new.position,
                     new.profile, "fake", new.bmc.address, "admin", box.encrypt("simulated"), "on",
                     json.dumps(simulated_facts(new.bmc.address, new.serial), sort_keys=True),
                     now, now))
        macs.extend((mac, node_id) for mac in new.macs)
        machines.append((new.bmc.address, "power", "on"))
        names.append((node_id, str(new.hostname)))
    with sqlite3.connect(state / "provisioner.sqlite") as conn:
        conn.executemany(
            "INSERT INTO node (id, hostname, serial, state, rack, position, profile, bmc_driver,"
            " bmc_address, bmc_username, bmc_password_enc, power_state, facts, created_at,"
            " updated_at, maintenance, maintenance_reason, last_error, checkpoint, version,"
            " history_seq) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,'','','[]',1,1)", rows)
        conn.executemany("INSERT INTO node_mac (mac, node_id) VALUES (?, ?)", macs)
        conn.executemany(
            "INSERT INTO transition (node_id, seq, event, from_state, to_state, actor, reason,"
            " created_at) VALUES (?, 1, 'seed', 'enrolled', 'active', 'bench', 'seeded', ?)",
            [(node_id, now) for node_id, _ in names])
        add_write_counters(conn)
    with sqlite3.connect(state / "simworld.sqlite") as world:
        world.executescript("CREATE TABLE IF NOT EXISTS machine (key TEXT NOT NULL, attr TEXT "
                            "NOT NULL, value TEXT NOT NULL, PRIMARY KEY (key, attr));")
        world.executemany("INSERT INTO machine (key, attr, value) VALUES (?, ?, ?)", machines)
    return names


def add_write_counters(conn: sqlite3.Connection) -> None:
    """Triggers counting every row the daemon inserts, updates or deletes, per table."""
    conn.execute("CREATE TABLE bench_writes (tbl TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    tables = [name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        " AND name NOT IN ('alembic_version', 'bench_writes')")]
    for table in tables:
        for op in ("INSERT", "UPDATE", "DELETE"):
            conn.execute(
                f"CREATE TRIGGER bench_{op.lower()}_{table} AFTER {op} ON \"{table}\" BEGIN "
                f"INSERT INTO bench_writes (tbl, n) VALUES ('{table}', 1) "
                "ON CONFLICT(tbl) DO UPDATE SET n = n + 1; END")


def writes(db: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        return dict(conn.execute("SELECT tbl, n FROM bench_writes"))


@contextlib.contextmanager
def kube_peer(names: list[tuple[str, str]]) -> Iterator[str | None]:
    """kube-apiserver + kwok with a Ready kwok Node per node (labelled with its id), or None
    when the peer is not built here."""
    from tests.peers.kube import kube_unavailable_reason, running_kube
    from tests.peers.kube_admin import KubeAdmin

    why = kube_unavailable_reason()
    if why is not None:
        print(f"# Kubernetes sync off: {why}", file=sys.stderr)
        yield None
        return
    with running_kube() as cluster:
        admin = KubeAdmin(cluster)
        try:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda pair: admin.create_node(
                    pair[1], labels={LABEL_NODE_ID: pair[0]}), names))
        finally:
            admin.close()
        yield str(cluster.kubeconfig)


@contextlib.contextmanager
def slurm_peer(names: list[tuple[str, str]]) -> Iterator[Path | None]:
    """slurmctld knowing every node, or None when it cannot run here. There is no slurmd per
    node: they are powered-down cloud nodes (``IDLE+CLOUD+POWERED_DOWN``, listed with
    ``PrivateData=cloud``), which slurmctld does not ping, so none turns ``NOT_RESPONDING``
    (a change the daemon rightly acts on)."""
    from tests.peers.slurm import (
        open_workdir,
        running_munged,
        running_slurmctld,
        slurm_unavailable_reason,
    )

    why = slurm_unavailable_reason()
    if why is not None:
        print(f"# Slurm sync off: {why}", file=sys.stderr)
        yield None
        return
    lines = [f"NodeName={name} NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 State=CLOUD"
             for _, name in names]
    with open_workdir("pv-idle-slurm-") as workdir, running_munged() as sock, \
            running_slurmctld(workdir, lines, None, sock, plugin="topology/none",
                              extra={"PrivateData": "cloud"}) as slurm:
        listed = slurm.scontrol("show", "node", "-o").count("NodeName=")
        if listed != len(names):
            raise SystemExit(f"slurmctld lists {listed} of {len(names)} nodes")
        yield slurm.conf


def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="pv-idle-bench-"))
    state = work / "state"
    config = work / "provisioner.toml"
    base = (f'state_dir = "{state}"\n[api]\nlisten = "127.0.0.1:{free_port()}"\n'
            f"[simulation]\nnodes = {args.nodes}\nracks = {max(1, args.nodes // 40)}\n"
            "step_delay_s = 0\n"
            f"[bmc]\npower_sync_interval_s = {args.power_sync_interval_s}\n"
            '[log]\nlevel = "WARNING"\n')
    config.write_text(base)
    names = seed(sys.executable, config, state, args.nodes)
    duties = ["power sync", "topology", "expiry sweeps", "history retention"]
    with ExitStack() as peers:
        kubeconfig = None if args.no_peers else peers.enter_context(kube_peer(names))
        slurm_conf = None if args.no_peers else peers.enter_context(slurm_peer(names))
        extra = ""
        if kubeconfig is not None:
            extra += f'[kube]\nkubeconfig = "{kubeconfig}"\n'
            duties.append("Kubernetes sync")
        if slurm_conf is not None:
            extra += f'[slurm]\nenabled = true\nslurm_conf = "{slurm_conf}"\n'
            duties.append("Slurm sync")
        config.write_text(base + extra)
        measure(args, work, state, config, duties)
    if args.keep:
        print(f"# kept: {work} (daemon.log, state/)")
    else:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, work: Path, state: Path, config: Path,
            duties: list[str]) -> None:
    db = state / "provisioner.sqlite"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(work / "notify.sock"))
    notify.settimeout(600)
    proc = subprocess.Popen([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], stdout=subprocess.DEVNULL,
                            stderr=open(work / "daemon.log", "wb"),  # noqa: SIM115
                            env=dict(os.environ, NOTIFY_SOCKET=str(work / "notify.sock")))
    samples: list[tuple[float, float]] = []
    sampler: subprocess.Popen[bytes] | None = None
    started = time.monotonic()
    try:
        while not notify.recv(4096).startswith(b"READY=1"):
            pass
        # the start (recovery over every node, the first topology) is not the fleet at rest
        time.sleep(args.settle_s)
        cpu0, writes0, t0 = cpu_seconds(proc.pid), writes(db), time.monotonic()
        if args.profile is not None:
            sampler = _profile.start(args.py_spy, proc.pid, args.profile, rate=100)
        while (elapsed := time.monotonic() - t0) < args.duration_s:
            if proc.poll() is not None:
                raise SystemExit(f"the daemon exited; see {work / 'daemon.log'}")
            samples.append((elapsed, rss_mib(proc.pid)))
            time.sleep(min(args.sample_s, max(0.1, args.duration_s - elapsed)))
        wall = time.monotonic() - t0
        cpu1, after = cpu_seconds(proc.pid), writes(db)
        own, children = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        cpu = own + children
        samples.append((wall, rss_mib(proc.pid)))
        _profile.stop([sampler])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        lifetime = time.monotonic() - started
        notify.close()
    with contextlib.closing(sqlite3.connect(state / "simworld.sqlite")) as world:
        # the reads of the whole run (written at the daemon's stop) and the power writes
        # (over the daemon's whole life, start to stop, not only the measured window)
        reads = world.execute("SELECT coalesce(sum(calls), 0) FROM reads").fetchone()[0]
        sets = world.execute("SELECT coalesce(sum(calls), 0) FROM ledger").fetchone()[0]
    delta = {t: after.get(t, 0) - writes0.get(t, 0) for t in after}
    node_rows = sum(n for t, n in delta.items() if t not in BOOKKEEPING)
    own_rows = sum(n for t, n in delta.items() if t in BOOKKEEPING)
    per_min = 60 / wall
    rss = [r for _, r in samples]
    print(f"# duties: {', '.join(duties)}; power sync every {args.power_sync_interval_s:g} s")
    print(f"# CPU: the daemon {own / wall * 100:.2f} % of one core, the commands it ran "
          f"(scontrol) {children / wall * 100:.2f} %")
    print("| nodes | held | daemon CPU, share of one core | RSS first → last (max) | "
          "node-scoped row writes/min | daemon bookkeeping rows/min | BMC calls/node/hour |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.nodes:,} | {wall:.0f} s | {cpu / wall * 100:.2f} % | {rss[0]:.0f} → "
          f"{rss[-1]:.0f} MiB ({max(rss):.0f}) | {node_rows * per_min:.1f} | "
          f"{own_rows * per_min:.1f} | {(reads + sets) / args.nodes * 3600 / lifetime:.1f} |")
    if node_rows:
        print("# node-scoped writes per table: " + ", ".join(
            f"{t} {n}" for t, n in sorted(delta.items()) if n and t not in BOOKKEEPING))
    print("# RSS over time (s: MiB): " + ", ".join(
        f"{t:.0f}: {r:.0f}" for t, r in samples[:: max(1, len(samples) // 12)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--settle-s", type=float, default=30.0,
                        help="wait after READY=1 before measuring")
    parser.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    parser.add_argument("--power-sync-interval-s", type=float, default=300.0,
                        help="bmc.power_sync_interval_s (the daemon's default: 300)")
    parser.add_argument("--no-peers", action="store_true",
                        help="no kube-apiserver/kwok nor slurmctld (their syncs stay off)")
    _profile.add_arguments(parser, "write py-spy's collapsed stacks of the measured window here")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work folder (the daemon's log, its database)")
    args = parser.parse_args()
    args.py_spy = _profile.py_spy(args)
    run(args)


if __name__ == "__main__":
    main()
