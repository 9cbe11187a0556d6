"""Several daemons on one PostgreSQL (issue 13, docs/ha.md): N simulated nodes enrolled ->
active with 1, 2 or 3 daemons sharing the database, measuring wall time and the daemons'
CPU time per node (all daemons together), on a PostgreSQL server the bench starts.

    python3 bench/ha_fleet_bench.py [--nodes 200] [--daemons 1 2 3] [--profile DIR]

Reported per run: wall time, the daemons' CPU per node (together and each), PostgreSQL's CPU
per node (the postmaster and its backends, from /proc), each daemon's peak RSS, the
database's size, and PostgreSQL's statements that took the most time (pg_stat_statements).
``--profile DIR`` samples every daemon with py-spy (the thread holding the GIL, 100 Hz) into
DIR, one file of collapsed stacks a daemon (``bench/profile_top.py FILE`` prints the top
entries).

Every daemon runs in its own process on this machine; on the 2-core development machine the
daemons compete for the same cores, so the scaling it shows is a floor, not a site's.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import _profile
import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from bench.rack_bench import cpu_seconds, free_port, rss_mib, tree_cpu_seconds
from tests.peers.postgres import PostgresServer, running_postgres


def slow_statements(dsn: str, dbname: str, top: int = 8) -> list[str]:
    """PostgreSQL's statements that took the most time in this database (pg_stat_statements)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT calls, total_exec_time, mean_exec_time, query FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) "
            "ORDER BY total_exec_time DESC LIMIT %s", (dbname, top)).fetchall()
    return [f"| {calls:,} | {total / 1000:.1f} s | {mean:.3f} ms | "
            f"`{' '.join(query.split())[:160]}` |" for calls, total, mean, query in rows]


def run(pg: PostgresServer, dbname: str, nodes: int, daemons: int, step_delay_s: float,
        profile: Path | None, spy: str | None) -> tuple[str, list[str]]:
    pg_url, dsn = pg.create_database(dbname), pg.dsn(dbname)
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
    work = Path(tempfile.mkdtemp(prefix="pv-ha-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    samplers: list[subprocess.Popen[bytes]] = []
    pg_cpu_before = tree_cpu_seconds(pg.pid)
    started = time.monotonic()
    try:
        for i in range(daemons):
            config = work / f"d{i}.toml"
            config.write_text(
                f'state_dir = "{work / "state"}"\ndatabase_url = "{pg_url}"\n'
                f'[api]\nlisten = "127.0.0.1:{free_port()}"\n'
                f"[simulation]\nnodes = {nodes}\nracks = {max(1, nodes // 40)}\n"
                f"step_delay_s = {step_delay_s}\n"
                "[lifecycle]\nmax_inspecting = 500\nmax_deploying = 200\n"
                'max_in_flight = 1000\n[log]\nlevel = "WARNING"\n')
            with (work / f"d{i}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "provisioner", "--config", str(config), "serve"],
                    stdout=log, stderr=subprocess.STDOUT))
            if profile is not None and spy is not None:
                samplers.append(_profile.start(spy, procs[-1].pid,
                                               profile / f"{daemons}d-{i}.txt", rate=100, gil=True))
        peak_rss = [0.0] * daemons
        while True:
            try:
                with psycopg.connect(dsn) as conn:
                    states = dict(conn.execute("SELECT state, count(*) FROM node "
                                               "GROUP BY state").fetchall())
            except psycopg.errors.UndefinedTable:  # not migrated yet
                states = {}
            done = states.get("active", 0)
            failed = sum(n for state, n in states.items() if state.endswith("_failed"))
            if done + failed >= nodes:
                break
            for i, p in enumerate(procs):
                if p.poll() is not None:
                    tail = (work / f"d{i}.log").read_text()[-3000:]
                    raise SystemExit(f"daemon {i} exited with {p.returncode}:\n{tail}")
                peak_rss[i] = max(peak_rss[i], rss_mib(p.pid))
            time.sleep(1.0)
        wall = time.monotonic() - started
        cpus = [cpu_seconds(p.pid) for p in procs]
        pg_cpu = tree_cpu_seconds(pg.pid) - pg_cpu_before
        _profile.stop(samplers)
        with psycopg.connect(dsn) as conn:
            writers = conn.execute("SELECT count(DISTINCT instance) FROM transition "
                                   "WHERE fence IS NOT NULL").fetchone()
            size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        slow = slow_statements(pg.dsn(), dbname)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    hottest = max(range(daemons), key=lambda i: cpus[i])
    row = (f"| {daemons} | {nodes:,} | {wall:.1f} s | {sum(cpus) / nodes * 1000:.1f} ms | "
           f"{' / '.join(f'{c / nodes * 1000:.1f}' for c in cpus)} ms | "
           f"{pg_cpu / nodes * 1000:.1f} ms | {' / '.join(f'{r:.0f}' for r in peak_rss)} MiB | "
           f"{(size[0] if size else 0) / 2**20:.0f} MiB | "
           f"{writers[0] if writers else 0} | {failed} |")
    if profile is not None:
        slow.append(f"(hottest daemon's profile: {profile / f'{daemons}d-{hottest}.txt'})")
    return row, slow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--step-delay-s", type=float, default=0.2)
    _profile.add_arguments(parser, "a folder for py-spy's collapsed stacks, one file a daemon")
    args = parser.parse_args()
    spy = _profile.py_spy(args)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows, slow = [], []
    with running_postgres(["shared_preload_libraries=pg_stat_statements"]) as pg:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        for n, count in enumerate(args.daemons):
            row, statements = run(pg, f"ha_bench_{n}", args.nodes, count, args.step_delay_s,
                                  args.profile, spy)
            rows.append(row)
            slow.append(f"\n{count} daemon(s), PostgreSQL's statements by total time:\n"
                        "| calls | total | mean | statement |\n|---|---|---|---|")
            slow.extend(statements)
    print("| daemons | nodes | wall, start -> all active | CPU per node (all daemons) "
          "| each daemon | PostgreSQL CPU per node | peak RSS each | database | "
          "daemons that drove steps | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n".join(slow))


if __name__ == "__main__":
    main()
