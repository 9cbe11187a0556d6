"""``provisioner serve`` under a systemd-like supervisor: READY=1 only once the API answers,
WATCHDOG=1 pings at half WATCHDOG_USEC, STOPPING=1 then exit 0 on SIGTERM; a bad config is a
one-line error and exit code 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.daemon_proc import free_port, write_config

pytestmark = pytest.mark.e2e


def test_notify_ready_watchdog_stopping(tmp_path: Path) -> None:
    notify_path = tmp_path / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(30)
    port = free_port()
    config = write_config(tmp_path / "p.toml", tmp_path / "state", port)
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="400000",
               JOURNAL_STREAM="8:1234")
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], env=env, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        messages = [notify.recv(4096).decode()]
        # READY=1 is sent only after every port is bound: the API answers at once.
        assert messages[0].startswith("READY=1"), messages
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            assert resp.status == 200
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            messages.append(notify.recv(4096).decode())
        assert sum(m == "WATCHDOG=1" for m in messages) >= 3  # every 0.2 s
        proc.terminate()
        messages.append(notify.recv(4096).decode())
        while messages[-1] == "WATCHDOG=1":
            messages.append(notify.recv(4096).decode())
        assert messages[-1] == "STOPPING=1"
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        notify.close()
    assert proc.stderr is not None
    log = proc.stderr.read().decode()
    assert "<6>provisioner.daemon: ready" in log  # journald priority prefix, no timestamp


def test_invalid_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "p.toml"
    config.write_text('[api]\nlisten = "not-an-address"\n')
    result = subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "api.listen" in result.stderr


def test_port_in_use_fails_the_start(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_config(tmp_path / "p.toml", tmp_path / "state", port)
        result = subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                                 "serve"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "cannot start" in result.stderr and "address already in use" in result.stderr
