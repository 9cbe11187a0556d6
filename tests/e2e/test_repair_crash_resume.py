"""A daemon SIGKILLed in the middle of a repair ladder resumes it at the rung it was on
(issue 24): a real ``provisioner serve`` with one simulated active node, a finding posted
over the API starts its ladder, the daemon is killed while a rung runs (the simulated
rung takes ``step_delay_s``), restarted, and the ladder goes on from that rung: one drain,
no rung climbed twice (history and the simulated machine's ledger), and it ends where the
class leads: ``active`` after a passing gate, or ``service_required`` out of rungs."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from provisioner.simulation.world import read_ledger
from tests.e2e.daemon_proc import DaemonProcess, free_port, write_config
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

pytestmark = pytest.mark.e2e

XID79 = ("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the "
         "bus.")
REPAIR_OPS = ("slurm_drain", "kube_cordon", "reset_gpu", "restart_os", "power_cycle",
              "fault_cleared", "slurm_resume", "kube_uncordon")
# (the machine's fault, the rung the daemon is killed in, where the ladder ends, the rungs
# climbed): a GPU off the bus (gpu-lost: reset_gpu, restart_os, power_cycle)
CASES = [
    pytest.param("restart_os", "restart_os", "active", ["reset_gpu", "restart_os"],
                 id="cleared-after-kill"),
    pytest.param("never", "power_cycle", "service_required",
                 ["reset_gpu", "restart_os", "power_cycle"], id="out-of-rungs"),
]


def wait(what: str, check, timeout_s: float, poll_s: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (found := check()) is not None:
            return found
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(("fault", "kill_in", "end", "climbed"), CASES)
def test_sigkill_mid_rung_resumes_the_ladder_at_that_rung(
        tmp_path: Path, fault: str, kill_in: str, end: str, climbed: list[str]) -> None:
    state_dir = tmp_path / "state"
    port = free_port()
    config = write_config(
        tmp_path / "provisioner.toml", state_dir, port,
        "[simulation]\nnodes = 1\nstep_delay_s = 1.0\n"
        "[daemon]\nshutdown_timeout_s = 5\n[health]\nbmc_poll_interval_s = 0\n")
    db, world = state_dir / "provisioner.sqlite", state_dir / "simworld.sqlite"
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    daemon.start()
    try:
        daemon.wait_ready(port, timeout_s=60)

        def active() -> tuple[str, str] | None:
            with sqlite3.connect(db, timeout=30) as conn:
                row = conn.execute("SELECT id, bmc_address, state FROM node").fetchone()
            return (row[0], row[1]) if row is not None and row[2] == "active" else None

        node_id, key = wait("the node active", active, 60, poll_s=0.2)
        set_fault(world, key, fault)
        token = operator_token(config)
        answer = post_finding(port, token, node_id, "gpu-lost", "reset_gpu", XID79,
                              "0000:18:00")
        assert [r["change"] for r in answer["results"]] == ["opened"], answer

        def inside_rung() -> list[str] | None:  # the rung's own sub-step has begun
            with sqlite3.connect(db, timeout=30) as conn:
                state, saved = checkpoint(conn, node_id)
            assert state == "repairing", (state, saved)
            before = climbed[: climbed.index(kill_in)]
            ready = "repair-drained" in saved and all(
                f"repair-gate:{rung}" in saved for rung in before)
            return saved if ready and f"repair-rung:{kill_in}" not in saved else None

        at_kill = wait(f"the ladder in rung {kill_in}", inside_rung, 30, poll_s=0.02)
        time.sleep(0.3)  # well inside the rung's simulated second
        daemon.kill()
        with sqlite3.connect(db, timeout=30) as conn:
            state, saved = checkpoint(conn, node_id)
        assert state == "repairing" and f"repair-rung:{kill_in}" not in saved, saved

        daemon.start()
        daemon.wait_ready(port, timeout_s=60)

        def ended() -> str | None:
            with sqlite3.connect(db, timeout=30) as conn:
                state = conn.execute("SELECT state FROM node WHERE id = ?",
                                     (node_id,)).fetchone()[0]
            return state if state != "repairing" else None

        final = wait("the ladder's end", ended, 60, poll_s=0.2)
    finally:
        code = daemon.stop()
    log = (tmp_path / "daemon.log").read_text()
    assert code == 0, log[-3000:]
    assert final == end, log[-3000:]
    assert "resuming" in log

    with sqlite3.connect(db, timeout=30) as conn:
        rows = ladder_rows(conn, node_id)
    context = f"checkpoint at kill={at_kill} rows={rows}"
    # one drain, one entry into the ladder, each rung climbed and validated once
    assert [r[2] for r in rows if r[1] != r[2]] == ["repairing", end], context
    assert sum(1 for r in rows if r[0] == DRAIN_EVENT) == 1, context
    lines = rung_lines(rows)
    for rung in climbed:
        assert sum(1 for line in lines if line.startswith(f"{rung}: done")) == 1, context
        assert sum(1 for line in lines if line.startswith(f"{rung}: validation")) == 1, context
    assert len(lines) == 2 * len(climbed), context
    last = [line for line in lines if "validation" in line][-1]
    assert ("passed" in last) == (end == "active"), context

    done = machine_effects(read_ledger(world), key)
    expected = {"slurm_drain": 1, "kube_cordon": 1} | {rung: 1 for rung in climbed}
    if end == "active":
        expected |= {"fault_cleared": 1, "slurm_resume": 1, "kube_uncordon": 1}
    assert {op: done.get(op, 0) for op in REPAIR_OPS} == {
        op: expected.get(op, 0) for op in REPAIR_OPS}, (done, context)
    if kill_in == "power_cycle":  # the BMC's off and on: once each in the ladder
        assert done["power_off"] == 3 and done["power_on"] == 4, done
