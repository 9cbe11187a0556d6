"""Several daemons on one PostgreSQL (issue 13, docs/ha.md): N simulated nodes enrolled ->
active with 1, 2 or 3 daemons sharing the database, measuring wall time and the daemons'
CPU time per node (all daemons together), on a PostgreSQL server the bench starts.

    python3 bench/ha_fleet_bench.py [--nodes 200] [--daemons 1 2 3]

Every daemon runs in its own process on this machine; on the 2-core development machine the
daemons compete for the same cores, so the scaling it shows is a floor, not a site's.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from bench.rack_bench import cpu_seconds, free_port
from tests.peers.postgres import running_postgres


def run(pg_url: str, dsn: str, nodes: int, daemons: int, step_delay_s: float) -> str:
    work = Path(tempfile.mkdtemp(prefix="pv-ha-bench-"))
    procs = []
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
            time.sleep(0.5)
        wall = time.monotonic() - started
        cpu = sum(cpu_seconds(p.pid) for p in procs)
        with psycopg.connect(dsn) as conn:
            writers = conn.execute("SELECT count(DISTINCT instance) FROM transition "
                                   "WHERE fence IS NOT NULL").fetchone()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    return (f"| {daemons} | {nodes:,} | {wall:.1f} s | {cpu / nodes * 1000:.1f} ms | "
            f"{writers[0] if writers else 0} | {failed} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--step-delay-s", type=float, default=0.2)
    args = parser.parse_args()
    rows = []
    with running_postgres() as pg:
        for n, count in enumerate(args.daemons):
            url = pg.create_database(f"ha_bench_{n}")
            rows.append(run(url, pg.dsn(f"ha_bench_{n}"), args.nodes, count,
                            args.step_delay_s))
    print("| daemons | nodes | wall, start -> all active | CPU per node (all daemons) "
          "| daemons that drove steps | failed |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
