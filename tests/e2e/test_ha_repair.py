"""Three daemons on one real PostgreSQL run the repair ladders of several active simulated
nodes (issue 24): findings are posted through different daemons' APIs, the same finding to
two daemons at once (and one class from two origins at once), the daemon driving some
ladders is SIGKILLed mid-rung and restarted. Each node's ladder runs once: one entry into
``repairing``, one drain, each rung climbed at most once (history and the simulator's
ledger), and no two daemons wrote for one node at once (instance ids, fencing numbers);
a node without a finding is never drained."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from provisioner.simulation.world import read_ledger
from tests.e2e.ha_support import Fleet, histories, node_states
from tests.e2e.repair_support import (
    DRAIN_EVENT,
    checkpoint,
    ladder_rows,
    machine_effects,
    operator_token,
    post_finding,
    rung_lines,
    set_fault,
)
from tests.peers.postgres import PostgresServer, postgres_unavailable_reason, running_postgres

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

LEASE_S = 3.0
XID79 = ("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the "
         "bus.")
RUNGS = ("reset_gpu", "restart_os", "power_cycle")
# per node (in id order): its fault, the rungs its ladder climbs, where it ends; the last
# node has no finding
PLAN: list[tuple[str | None, tuple[str, ...], str]] = [
    ("reset_gpu", ("reset_gpu",), "active"),
    ("restart_os", ("reset_gpu", "restart_os"), "active"),
    ("power_cycle", RUNGS, "active"),
    ("never", RUNGS, "service_required"),
    ("restart_os", ("reset_gpu", "restart_os"), "active"),
    (None, (), "active"),
]


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


def wait(what: str, check: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (found := check()) is not None:
            return found
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def at_once(*calls: Callable[[], object]) -> None:
    """Each call in its own thread, released together."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        barrier.wait()
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors


def test_three_daemons_run_each_ladder_once(pg: PostgresServer, tmp_path: Path) -> None:
    url, dsn = pg.create_database("ha_repair"), pg.dsn("ha_repair")
    fleet = Fleet(tmp_path, url, 3,
                  f"[simulation]\nnodes = {len(PLAN)}\nracks = 3\nstep_delay_s = 0.7\n"
                  "[daemon]\nshutdown_timeout_s = 5\n"
                  "[health]\nbmc_poll_interval_s = 0\nmax_repairing_fraction = 1.0\n"
                  "max_repairing_fraction_rack = 1.0\nmax_repairing_fraction_domain = 1.0\n"
                  f"[ha]\nlease_s = {LEASE_S}\n")
    world = fleet.state_dir / "simworld.sqlite"
    ports = fleet.ports
    kills: list[tuple[int, str, list[str]]] = []  # (daemon, node, its checkpoint then)
    try:
        for daemon in fleet.daemons:
            daemon.start()
        for daemon, port in zip(fleet.daemons, ports, strict=True):
            daemon.wait_ready(port, timeout_s=120)
        wait("every node active", lambda: True if (s := node_states(dsn)) and len(s) == len(
            PLAN) and set(s.values()) == {"active"} else None, 90, poll_s=0.3)
        with psycopg.connect(dsn) as conn:
            nodes = conn.execute("SELECT id, bmc_address FROM node ORDER BY id").fetchall()
        keys = {node_id: key for node_id, key in nodes}
        ids = [node_id for node_id, _ in nodes]
        for node_id, (fault, _rungs, _end) in zip(ids, PLAN, strict=True):
            if fault is not None:
                set_fault(world, keys[node_id], fault)
        token = operator_token(fleet.daemons[0].config)

        def post(i: int, node_id: str, origin: str = "external") -> Callable[[], object]:
            return lambda: post_finding(ports[i % 3], token, node_id, "gpu-lost", "reset_gpu",
                                        XID79, "0000:18:00", origin)

        # the same finding to two daemons at once; one class from two origins (two
        # findings) to two daemons at once; one node each through the others
        at_once(post(0, ids[0]), post(1, ids[0]))
        at_once(post(1, ids[4]), post(2, ids[4], "in-band"))
        for i, node_id in enumerate(ids[1:4], start=1):
            post(i, node_id)()

        def driver_in_rung() -> tuple[int, str, list[str]] | None:
            """A daemon holding the lease of a node whose ladder is inside a rung."""
            with psycopg.connect(dsn) as conn:
                leases = dict(conn.execute(
                    "SELECT node_id, owner FROM node_lease WHERE owner IS NOT NULL").fetchall())
                for node_id in ids[1:4]:  # ladders of two rungs or more
                    state, saved = checkpoint(conn, node_id, "%s")
                    owner = leases.get(node_id)
                    if state != "repairing" or owner is None or "repair-drained" not in saved:
                        continue
                    if any(f"repair-rung:{r}" in saved for r in RUNGS[1:]):
                        continue  # past the first rung: too late to see a resume
                    for i, daemon in enumerate(fleet.daemons):
                        if daemon.proc is not None and f"-{daemon.proc.pid}-" in owner:
                            return i, node_id, saved
            return None

        victim, node_id, saved = wait("a ladder in its first rungs", driver_in_rung, 30,
                                      poll_s=0.05)
        fleet.daemons[victim].kill()
        kills.append((victim, node_id, saved))
        fleet.daemons[victim].start()  # a new instance: the others take its nodes over

        def ended() -> dict[str, str] | None:
            states = node_states(dsn)
            return states if "repairing" not in states.values() and all(
                states[n] == end for n, (_f, _r, end) in zip(ids, PLAN, strict=True)) else None

        try:
            wait("every ladder's end", ended, 90, poll_s=0.3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {node_states(dsn)} {histories(dsn)}") from None
    finally:
        codes = [daemon.stop() for daemon in fleet.daemons]
    context = f"kills={kills}"
    assert codes == [0, 0, 0], context + "".join(d.tail() for d in fleet.daemons)
    assert "took over" in fleet.logs() or "resuming" in fleet.logs(), context

    ledger = read_ledger(world)
    with psycopg.connect(dsn) as conn:
        for node_id, (fault, climbed, end) in zip(ids, PLAN, strict=True):
            done = machine_effects(ledger, keys[node_id])
            if fault is None:  # no finding: never drained
                assert "slurm_drain" not in done and "kube_cordon" not in done, done
                continue
            rows = ladder_rows(conn, node_id, "%s")
            where = (node_id, fault, rows, context)
            assert [r[2] for r in rows if r[1] != r[2]] == ["repairing", end], where
            assert sum(1 for r in rows if r[0] == DRAIN_EVENT) == 1, where
            lines = rung_lines(rows)
            for rung in climbed:
                assert sum(1 for x in lines if x.startswith(f"{rung}: done")) == 1, where
                assert sum(1 for x in lines if x.startswith(f"{rung}: valid")) == 1, where
            assert len(lines) == 2 * len(climbed), where
            assert done["slurm_drain"] == 1 and done["kube_cordon"] == 1, (done, where)
            assert {r: done.get(r, 0) for r in RUNGS} == {
                r: int(r in climbed) for r in RUNGS}, (done, where)
            undrained = int(end == "active")
            assert done.get("slurm_resume", 0) == undrained, (done, where)
            assert done.get("kube_uncordon", 0) == undrained, (done, where)

    # fenced writes never interleave: fencing numbers never decrease, each is one daemon's
    for node_id, history in histories(dsn).items():
        assert [h[0] for h in history] == list(range(1, len(history) + 1)), node_id
        fences = [h[4] for h in history if h[4] is not None]
        assert fences == sorted(fences), (node_id, history)
        owner: dict[int, str | None] = {}
        for _seq, _before, _after, instance, fence in history:
            if fence is not None:
                assert owner.setdefault(fence, instance) == instance, (node_id, history)
    # the killed daemon's ladder went on in another instance (the restarted one is new)
    with psycopg.connect(dsn) as conn:
        writers = {r[4] for r in ladder_rows(conn, kills[0][1], "%s") if r[4] is not None}
    assert len(writers) >= 2, (writers, context)
