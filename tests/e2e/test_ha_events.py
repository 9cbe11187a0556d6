"""Two daemons on one PostgreSQL: ``provisioner events --follow`` on one daemon prints the
transitions the other daemon commits, and ``--since`` gives the same lines on either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.ha_support import Fleet
from tests.peers.postgres import PostgresServer, postgres_unavailable_reason, running_postgres

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SETTINGS = ("[lifecycle]\nauto_inspect = false\nauto_deploy = false\n"
            "[daemon]\nshutdown_timeout_s = 5\n[ha]\n")  # instance = … follows


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


def _cli(port: int, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    env |= {"PROVISIONER_URL": f"http://127.0.0.1:{port}", "PROVISIONER_TOKEN": token}
    return subprocess.run([sys.executable, "-m", "provisioner", *args], capture_output=True,
                          text=True, timeout=60, env=env, check=True)


def _post(port: int, token: str, path: str, body: object) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.load(response)
    return answer


def test_each_daemon_streams_the_other_daemons_transitions(pg: PostgresServer,
                                                           tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, pg.create_database("ha_events"), 2, SETTINGS)
    for i, daemon in enumerate(fleet.daemons):
        daemon.config.write_text(daemon.config.read_text() + f'instance = "ev-{i}"\n')
    follower: subprocess.Popen[str] | None = None
    try:
        for daemon, port in zip(fleet.daemons, fleet.ports, strict=True):
            daemon.start()
            daemon.wait_ready(port, timeout_s=120)
        token = subprocess.run(
            [sys.executable, "-m", "provisioner", "--config", str(fleet.daemons[0].config),
             "token", "create", "--role", "admin", "--name", "ha-events"],
            capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()[-1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
        env |= {"PROVISIONER_URL": f"http://127.0.0.1:{fleet.ports[1]}",
                "PROVISIONER_TOKEN": token}
        follower = subprocess.Popen(
            [sys.executable, "-m", "provisioner", "events", "--follow", "--last", "0",
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        out = follower.stdout
        assert out is not None
        seen: list[dict[str, object]] = []
        threading.Thread(target=lambda: seen.extend(json.loads(line) for line in out),
                         daemon=True).start()
        time.sleep(1.5)  # connected
        node = _post(fleet.ports[0], token, "/api/v1/nodes",  # through daemon 0
                     {"hostname": "ha-ev-01", "macs": ["52:54:00:ee:01:01"]})
        _post(fleet.ports[0], token, f"/api/v1/nodes/{node['id']}/actions/maintenance-on",
              {"reason": "from ev-0"})
        deadline = time.monotonic() + 15
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [(e["hostname"], e["event"], e["instance"]) for e in seen] == [
            ("ha-ev-01", "enroll", "ev-0"), ("ha-ev-01", "maintenance_on", "ev-0")], seen
        first = str(seen[0]["transition"])
        on_0 = _cli(fleet.ports[0], token, "events", "--since", first).stdout
        on_1 = _cli(fleet.ports[1], token, "events", "--since", first).stdout
        assert on_0 == on_1 and on_0.startswith(f"#{seen[1]['transition']} "), (on_0, on_1)
    finally:
        if follower is not None:
            follower.terminate()
            follower.wait(10)
        codes = [daemon.stop() for daemon in fleet.daemons if daemon.proc is not None]
    assert codes == [0, 0], fleet.logs()[-3000:]
