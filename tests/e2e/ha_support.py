"""Several ``provisioner serve`` processes on one real PostgreSQL (the HA e2e tests)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psycopg

from tests.e2e.daemon_proc import DaemonProcess, free_port

PATH = ["enrolled", "inspecting", "inspected", "deploying", "configuring", "joining",
        "validating", "registering", "active"]
EFFECTS = {"bootdev": 2, "power_on": 3, "power_off": 2, "image_write": 1, "configure": 1,
           "kube_join": 1, "slurm_register": 1}


class Fleet:
    """``count`` daemons sharing one state_dir (secret key, simulated world) and one
    PostgreSQL database, each on its own API port."""

    def __init__(self, tmp: Path, database_url: str, count: int, extra: str) -> None:
        self.state_dir = tmp / "state"
        self.ports = [free_port() for _ in range(count)]
        self.daemons = []
        for i, port in enumerate(self.ports):
            config = tmp / f"d{i}.toml"
            config.write_text(f'state_dir = "{self.state_dir}"\n'
                              f'database_url = "{database_url}"\n'
                              f'[api]\nlisten = "127.0.0.1:{port}"\n{extra}')
            self.daemons.append(DaemonProcess(config, tmp / f"d{i}.log"))

    def logs(self) -> str:
        return "".join(d.log_path.read_text() for d in self.daemons if d.log_path.exists())


def node_states(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT id, state FROM node").fetchall())  # type: ignore[arg-type]


def histories(dsn: str) -> dict[str, list[tuple[int, str, str, str | None, int | None]]]:
    """node id -> [(seq, from, to, instance, fence)], in seq order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT node_id, seq, from_state, to_state, instance, fence "
                            "FROM transition ORDER BY node_id, seq").fetchall()
    found: dict[str, list[tuple[int, str, str, str | None, int | None]]] = {}
    for node_id, seq, before, after, instance, fence in rows:
        found.setdefault(node_id, []).append((seq, before, after, instance, fence))
    return found


def check_one_pass(node_id: str, history: Sequence[tuple[int, str, str, str | None,
                                                         int | None]]) -> None:
    """Gapless, one pass through PATH, and fenced writes never interleave: fencing
    numbers never decrease, and each belongs to one instance."""
    assert [h[0] for h in history] == list(range(1, len(history) + 1)), node_id
    assert [h[2] for h in history] == PATH, (node_id, history)
    fences = [h[4] for h in history if h[4] is not None]
    assert fences == sorted(fences), (node_id, history)
    owner: dict[int, str | None] = {}
    for _seq, _before, _after, instance, fence in history:
        if fence is not None:
            assert owner.setdefault(fence, instance) == instance, (node_id, history)


def get_json(port: int, path: str, token: str) -> object:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def viewer_token(config: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                           "token", "create", "--role", "viewer", "--name", "ha-test"],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.splitlines()[-1]
