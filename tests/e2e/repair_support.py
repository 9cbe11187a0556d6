"""What the repair-ladder e2e tests share: a finding posted over the API, a simulated
machine's fault set in the world's own file, the ladder's checkpoint and history read back
from the daemon's database (SQLite or PostgreSQL, through a DB-API connection)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Protocol

RUNG_EVENT = "repair_rung"
DRAIN_EVENT = "repair_drain"


class _Conn(Protocol):
    def execute(self, query: Any, params: Any = ...) -> Any: ...



def operator_token(config: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                           "token", "create", "--role", "operator", "--name", "repair-e2e"],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.splitlines()[-1]


def post_finding(port: int, token: str, node: str, cls: str, action: str,
                 evidence: str, subject: str = "", origin: str = "external") -> dict[str, Any]:
    body = json.dumps({"node": node, "origin": origin, "findings": [
        {"class": cls, "action": action, "evidence": evidence, "subject": subject}]})
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/health/findings", data=body.encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        found = json.load(response)
    assert isinstance(found, dict)
    return found


def set_fault(world: Path, key: str, fault: str) -> None:
    """The simulated machine's fault (``simulation.drivers.FAULT``): the mildest rung that
    clears it, or ``never``. Written beside the daemons, as a failing part would."""
    with sqlite3.connect(world, timeout=30) as db:
        db.execute("INSERT INTO machine(key, attr, value) VALUES (?, 'fault', ?) "
                   "ON CONFLICT(key, attr) DO UPDATE SET value=excluded.value", (key, fault))


def machine_effects(ledger: dict[tuple[str, str], tuple[int, int]],
                    key: str) -> dict[str, int]:
    return {op: effects for (k, op), (_calls, effects) in ledger.items() if k == key}


def ladder_rows(conn: _Conn, node_id: str, mark: str = "?") -> list[tuple[str, str, str,
                                                                           str, str | None,
                                                                           int | None]]:
    """The node's history rows since its ladder started: (event, from, to, reason,
    instance, fence), in order."""
    rows = conn.execute(
        f"SELECT event, from_state, to_state, reason, instance, fence FROM transition "
        f"WHERE node_id = {mark} ORDER BY seq", (node_id,)).fetchall()
    start = next((i for i, row in enumerate(rows) if row[2] == "repairing"), None)
    assert start is not None, f"node {node_id}: its ladder never started: {rows}"
    return [tuple(row) for row in rows[start:]]  # type: ignore[misc]


def rung_lines(rows: list[tuple[str, str, str, str, str | None, int | None]]) -> list[str]:
    return [row[3] for row in rows if row[0] == RUNG_EVENT]


def checkpoint(conn: _Conn, node_id: str, mark: str = "?") -> tuple[str, list[str]]:
    state, saved = conn.execute(f"SELECT state, checkpoint FROM node WHERE id = {mark}",
                                (node_id,)).fetchone()
    return str(state), list(json.loads(saved))

