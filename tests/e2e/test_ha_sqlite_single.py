"""SQLite stays single-daemon: a second ``provisioner serve`` on the same SQLite file refuses
to start with a one-line reason, and the first keeps serving; after the first is killed
(SIGKILL: the kernel drops its lock), a new daemon starts on the file."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.e2e.daemon_proc import DaemonProcess, free_port, write_config

pytestmark = pytest.mark.e2e


def test_second_daemon_on_one_sqlite_file_refuses_to_start(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    ports = [free_port(), free_port()]
    first = DaemonProcess(write_config(tmp_path / "a.toml", state_dir, ports[0]),
                          tmp_path / "a.log")
    second = DaemonProcess(write_config(tmp_path / "b.toml", state_dir, ports[1]),
                           tmp_path / "b.log")
    first.start()
    try:
        first.wait_ready(ports[0], timeout_s=60)
        second.start()
        assert second.proc is not None
        assert second.proc.wait(timeout=60) == 2
        refused = [line for line in (tmp_path / "b.log").read_text().splitlines()
                   if "cannot start" in line]
        assert len(refused) == 1, (tmp_path / "b.log").read_text()
        assert "already serves the SQLite database" in refused[0]
        assert str(state_dir / "provisioner.sqlite") in refused[0]
        assert "Traceback" not in (tmp_path / "b.log").read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/healthz", timeout=5):
            pass  # the first one still serves
        first.kill()
        second.start()
        second.wait_ready(ports[1], timeout_s=60)
        assert second.stop() == 0
    finally:
        first.stop()
        second.stop()
