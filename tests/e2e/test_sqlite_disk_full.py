"""SQLite on a full disk: the database lives on a 1 MiB tmpfs the test mounts in a private
mount namespace (``unshare -m``) around one ``provisioner serve`` onboarding simulated
nodes. The test fills that filesystem (through ``/proc/PID/root``) mid-onboarding and proves:
a transition that cannot be written fails with a clear, logged error and the daemon keeps
running; an API write is answered 503 with the reason; reads (``GET /api/v1/nodes``) keep
being served; every node's state agrees with its last history row; once space is back the
daemon resumes writing and every node ends ``active`` with one gapless pass and every side
effect once."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from provisioner.simulation.world import read_ledger
from tests.e2e.daemon_proc import DaemonProcess, write_config
from tests.e2e.ha_support import EFFECTS, check_one_pass
from tests.peers.ports import free_tcp_port

pytestmark = pytest.mark.e2e

NODES = 8
TMPFS_SIZE = "1m"
FULL = "database or disk is full"
_MOUNT = 'mount -t tmpfs -o size={size},mode=0700 provisioner-df "$0" && '


def _mount_unavailable_reason(probe: Path) -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) missing"
    probe.mkdir()
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           _MOUNT.format(size="64k") + "true", str(probe)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"cannot mount a tmpfs in a private mount namespace: {done.stderr.strip()}"
    return None


class NamespacedDaemon(DaemonProcess):
    """``provisioner serve`` whose database directory is a small tmpfs seen only by it;
    an admin token is made there first (the database exists only in that namespace)."""

    def __init__(self, config: Path, log_path: Path, db_dir: Path, token_file: Path) -> None:
        super().__init__(config, log_path)
        self.db_dir = db_dir
        self.token_file = token_file

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("PYTHONASYNCIODEBUG", None)
        provisioner = f'"{sys.executable}" -m provisioner --config "{self.config}"'
        script = (_MOUNT.format(size=TMPFS_SIZE)
                  + f'{provisioner} token create --role admin --name disk-full '
                  f'> "{self.token_file}" && exec {provisioner} serve')
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(self.db_dir)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    @property
    def seen_db_dir(self) -> Path:
        """The database directory as the daemon sees it (its mount namespace)."""
        assert self.proc is not None
        return Path(f"/proc/{self.proc.pid}/root{self.db_dir}")


def _call(port: int, token: str, method: str, path: str,
          body: dict[str, Any] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _nodes(port: int, token: str) -> dict[str, str]:
    status, page = _call(port, token, "GET", "/api/v1/nodes?limit=100")
    assert status == 200, page
    return {item["id"]: item["state"] for item in page["items"]}


def _history(port: int, token: str, node_id: str) -> list[tuple[int, str, str, str | None,
                                                                  int | None]]:
    status, page = _call(port, token, "GET", f"/api/v1/nodes/{node_id}/history")
    assert status == 200, page
    return [(h["seq"], h["from_state"], h["to_state"], h["instance"], h["fence"])
            for h in page["items"]]


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Filler(threading.Thread):
    """Keeps the filesystem of ``directory`` full (space the daemon frees, by truncating its
    WAL for instance, is taken again at once) until ``stop``; then deletes its file."""

    def __init__(self, directory: Path) -> None:
        super().__init__(name="filler", daemon=True)
        self.path = directory / "filler"
        self.written = 0
        self.full = threading.Event()
        self._halt = threading.Event()

    def run(self) -> None:
        chunk = b"\0" * 4096
        with self.path.open("ab", buffering=0) as filler:
            while not self._halt.is_set():
                try:
                    self.written += filler.write(chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    self.full.set()
                    self._halt.wait(0.02)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.path.unlink()


def test_sqlite_disk_full_fails_writes_cleanly_serves_reads_and_resumes(
        tmp_path: Path) -> None:
    if (reason := _mount_unavailable_reason(tmp_path / "probe")) is not None:
        pytest.skip(reason)
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    port = free_tcp_port()
    config = write_config(
        tmp_path / "df.toml", tmp_path / "state", port,
        f"[simulation]\nnodes = {NODES}\nstep_delay_s = 0.4\n"
        "[daemon]\nshutdown_timeout_s = 5\n[ha]\nlease_s = 2\n")
    config.write_text(f'database_url = "sqlite:///{db_dir}/provisioner.sqlite"\n'
                      + config.read_text())
    daemon = NamespacedDaemon(config, tmp_path / "df.log", db_dir, tmp_path / "token")
    filler: Filler | None = None
    daemon.start()
    try:
        daemon.wait_ready(port, timeout_s=120)
        token = daemon.token_file.read_text().splitlines()[-1]
        _wait("onboarding under way", lambda: sum(
            s not in ("enrolled", "inspecting") for s in _nodes(port, token).values()) >= 2, 60)
        filler = Filler(daemon.seen_db_dir)
        filler.start()
        assert filler.full.wait(30)
        _wait("a write failing for the full disk",
              lambda: FULL in daemon.log_path.read_text(), 60)
        time.sleep(2.0)  # several more rounds of steps, lease renewals and sweeps fail
        assert daemon.proc is not None and daemon.proc.poll() is None, "the daemon crashed"
        log = daemon.log_path.read_text()
        assert "step stops here" in log or "step dropped" in log, log[-3000:]
        # an API write is refused with the reason; reads are served
        status, problem = _call(port, token, "POST", "/api/v1/nodes",
                                {"hostname": "late-arrival", "serial": "DF-LATE"})
        assert status == 503 and FULL in problem["detail"], (status, problem)
        while_full = _nodes(port, token)
        assert len(while_full) == NODES
        for node_id, state in while_full.items():  # no half-written transition
            assert _history(port, token, node_id)[-1][2] == state, node_id
        assert set(while_full.values()) != {"active"}, "the disk filled too late to matter"
        filler.stop()  # space is back
        _wait("every node active", lambda: set(_nodes(port, token).values()) == {"active"},
              180)
        status, created = _call(port, token, "POST", "/api/v1/nodes",
                                {"hostname": "late-arrival", "serial": "DF-LATE"})
        assert status == 201, created
        final = _nodes(port, token)
        histories = {n: _history(port, token, n) for n in final if n != created["id"]}
    finally:
        if filler is not None and filler.is_alive():
            filler.stop()
        code = daemon.stop()
    assert code == 0
    log = daemon.log_path.read_text()
    assert "Traceback" not in log, log[-5000:]
    assert len(final) == NODES + 1
    for node_id, history in histories.items():
        check_one_pass(node_id, history)
    ledger = read_ledger(tmp_path / "state" / "simworld.sqlite")
    for machine in {key for key, _ in ledger}:
        done = {op: e for (key, op), (_calls, e) in ledger.items() if key == machine}
        assert done == EFFECTS, (machine, done)
    failures = sum(FULL in line for line in log.splitlines())
    assert filler is not None
    print(f"\nSQLite disk full: {TMPFS_SIZE} tmpfs, filler {filler.written // 1024} KiB; "
          f"{failures} logged write failures; all {NODES} nodes active after space came back")
