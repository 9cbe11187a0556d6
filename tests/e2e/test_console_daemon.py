"""The console served by a real daemon (``provisioner serve`` as a subprocess) over a
simulated rack (``[simulation]``, the fake drivers): sign in through the form, the fleet
page lists every simulated node, ``/api/v1/events`` streams their transitions to the
session, and a SIGTERM ends the daemon cleanly with a stream still open."""

from __future__ import annotations

import http.client
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.daemon_proc import DaemonProcess, free_port, write_config

pytestmark = pytest.mark.e2e


def pv(config: Path, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                           *args], check=True, capture_output=True, text=True).stdout


def request(port: int, method: str, path: str, *, body: str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, dict(response.getheaders()), text


def test_console_on_a_simulated_rack_with_live_events(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path / "provisioner.toml", tmp_path / "state", port,
                          "[simulation]\nnodes = 8\nracks = 2\nstep_delay_s = 0.2\n")
    pv(config, "db", "upgrade")
    token = pv(config, "token", "create", "--role", "viewer", "--name", "v").split()[-1]
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    daemon.start()
    stream: http.client.HTTPConnection | None = None
    try:
        daemon.wait_ready(port)
        bearer = {"Authorization": f"Bearer {token}"}
        while '"total":8' not in request(port, "GET", "/api/v1/nodes?limit=1",
                                         headers=bearer)[2]:
            time.sleep(0.1)  # the simulated rack is being enrolled
        status, headers, _ = request(port, "GET", "/ui/")
        assert status == 303 and headers["Location"].startswith("/ui/signin")
        status, headers, _ = request(
            port, "POST", "/ui/signin", body=f"token={token}",
            headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 303
        cookie = headers["Set-Cookie"].split(";")[0]
        stream = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        stream.request("GET", "/api/v1/events", headers={"Cookie": cookie})
        events = stream.getresponse()
        assert events.status == 200
        assert events.getheader("Content-Type") == "text/event-stream"
        status, _, page = request(port, "GET", "/ui/", headers={"Cookie": cookie})
        assert status == 200
        cells = re.findall(r'class="cell [^"]*" href="[^"]+" data-hostname="([^"]+)"', page)
        assert sorted(cells) == [f"sim-r{r:02d}-n{n:03d}" for r in (1, 2) for n in (1, 2, 3, 4)]
        status, _, health = request(port, "GET", "/ui/health", headers={"Cookie": cookie})
        assert status == 200 and 'aria-label="Open findings"' in health  # the intake wired
        assert "not wired" not in health and 'aria-label="Service required"' in health
        seen = b""
        while b"event: transition" not in seen:  # the simulated nodes are being inspected
            seen += events.fp.read1(65536)
        assert b'"hostname": "sim-r0' in seen
        assert daemon.stop() == 0  # with the stream still open
        rest = b""
        while chunk := events.fp.read1(65536):
            rest += chunk
        assert b"event: transition" in seen + rest  # and the stream ended (EOF above)
    finally:
        if stream is not None:
            stream.close()
        daemon.stop()
    log = (tmp_path / "daemon.log").read_text()
    assert token not in log and "Traceback" not in log
