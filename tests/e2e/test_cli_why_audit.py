"""``provisioner node why`` / ``GET /api/v1/nodes/{id}/why`` and ``provisioner audit`` /
``GET /api/v1/history`` against a real daemon (``provisioner serve`` as a subprocess, fake
drivers): issue 30 item 10."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from tests.e2e.test_cli_api import STATE_DEADLINE_S, Daemon, as_json
from tests.e2e.test_cli_api import cli as cli  # noqa: F401  (fixtures)
from tests.e2e.test_cli_api import daemon as daemon  # noqa: F401
from tests.e2e.test_cli_api import token as token  # noqa: F401

pytestmark = pytest.mark.e2e

NODE = "why-e2e-01"
HOLDS = ["state", "maintenance", "gates", "health"]
PATH = ["bmc", "power", "boot", "callback", "kube", "gpu", "validation", "domain", "slurm"]


def api_get(daemon: Daemon, token: str, path: str, **query: Any) -> Any:  # noqa: F811
    url = f"{daemon.url}{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query, doseq=True)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def running(daemon: Daemon, token: str) -> str:  # noqa: F811
    """An active node (registered running: brownfield), powered on."""
    from tests.e2e.test_cli_api import run_cli

    def call(*args: str) -> Any:
        result = run_cli(daemon, *args, token=token)
        assert result.returncode == 0, result.stderr
        return result

    call("node", "enroll", "--hostname", NODE, "--serial", "WHY-01", "--mac",
         "52:54:00:77:00:01", "--bmc-driver", "fake", "--bmc-address", "SIM-WHY-01")
    call("node", "action", NODE, "register-running", "--reason", "runs the site image")
    call("node", "power", NODE, "on")
    return NODE


def _wait_schedulable(cli: Any, node: str) -> dict[str, Any]:  # noqa: F811
    deadline = time.monotonic() + STATE_DEADLINE_S
    while True:
        answer: dict[str, Any] = as_json(cli("node", "why", node, "--json", ok=False))
        if answer["schedulable"] or time.monotonic() > deadline:
            return answer
        time.sleep(0.3)


def test_an_active_node_is_schedulable_one_line_per_check(
        cli: Any, daemon: Daemon, token: str, running: str) -> None:  # noqa: F811
    answer = _wait_schedulable(cli, running)
    assert answer["schedulable"] is True, answer
    assert answer["state"] == "active" and answer["first_blocking"] is None
    assert [s["key"] for s in answer["steps"]] == HOLDS + PATH
    assert not any(s["blocking"] for s in answer["steps"])
    result = cli("node", "why", running)
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{running} (") and lines[0].endswith("active: schedulable")
    checks = [line.split()[:2] for line in lines[1:]]
    assert [key for _, key in checks] == HOLDS + PATH
    assert {mark for mark, _ in checks} <= {"ok", "unknown"}
    power = next(line for line in lines if line.split()[1] == "power")
    assert power.split()[0] == "ok" and "on" in power
    # the API answers the same, by any key of the node
    by_serial = api_get(daemon, token, "/api/v1/nodes/WHY-01/why")
    assert by_serial["id"] == answer["id"] and by_serial["schedulable"] is True


def test_maintenance_makes_it_unschedulable_with_the_reason(
        cli: Any, daemon: Daemon, token: str, running: str) -> None:  # noqa: F811
    _wait_schedulable(cli, running)
    cli("node", "action", running, "maintenance-on", "--reason", "PSU swap, RMA 4411")
    try:
        result = cli("node", "why", running, ok=False)
        assert result.returncode == 3, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].endswith("not schedulable (first blocking: maintenance)")
        blocking = [line for line in lines[1:] if line.startswith("blocking")]
        assert blocking == [
            "blocking maintenance in maintenance: PSU swap, RMA 4411 -- do: maintenance-off "
            "once the work is done"]
        assert cli("node", "why", running, "-q", ok=False).stdout == ""
        answer = api_get(daemon, token, f"/api/v1/nodes/{running}/why")
        assert answer["schedulable"] is False and answer["first_blocking"] == "maintenance"
        step = next(s for s in answer["steps"] if s["key"] == "maintenance")
        assert step["status"] == "fail" and step["blocking"] is True
    finally:
        cli("node", "action", running, "maintenance-off")
    assert cli("node", "why", running, "-q").returncode == 0


def test_an_enrolled_node_waits_at_its_state_and_unknown_is_a_404(cli: Any) -> None:  # noqa: F811
    cli("node", "enroll", "--hostname", "why-e2e-02", "--serial", "WHY-02", "--mac",
        "52:54:00:77:00:02")
    answer = as_json(cli("node", "why", "why-e2e-02", "--json", ok=False))
    assert answer["schedulable"] is False and answer["state"] == "enrolled"
    steps = {s["key"]: s for s in answer["steps"]}
    assert steps["state"]["status"] == "wait" and steps["bmc"]["status"] == "unknown"
    assert answer["first_blocking"] == "boot"  # nothing fails; the first wait on its path
    missing = cli("node", "why", "no-such-node", ok=False)
    assert missing.returncode == 1 and "no-such-node" in missing.stderr


def test_audit_lists_who_did_what_filtered_and_paged(
        cli: Any, daemon: Daemon, token: str, running: str) -> None:  # noqa: F811
    cli("node", "action", running, "maintenance-on", "--reason", "audit me")
    cli("node", "action", running, "maintenance-off")
    lines = cli("audit", "--node", running, "--since", "1h").stdout.splitlines()
    assert lines, "no history"
    assert "maintenance" in lines[0] and "by token:e2e-admin" in lines[0]  # newest first
    assert any("audit me" in line for line in lines)
    assert any("register" in line and "runs the site image" in line for line in lines)
    ids = [int(line.split()[0].lstrip("#")) for line in lines]
    assert ids == sorted(ids, reverse=True)
    rows = [json.loads(line) for line in cli(
        "audit", "--actor", "token:*", "--node", running, "--json").stdout.splitlines()]
    assert rows and {r["actor"] for r in rows} == {"token:e2e-admin"}
    assert {r["hostname"] for r in rows} == {running}
    events = {r["event"] for r in rows}
    only = [json.loads(line) for line in cli(
        "audit", "--node", running, "--event", sorted(events)[0], "--json").stdout.splitlines()]
    assert only and {r["event"] for r in only} == {sorted(events)[0]}
    assert cli("audit", "--node", running, "--until", "2000-01-01").stdout == ""
    # the API's pages: newest first with a cursor, or oldest first to resume
    first = api_get(daemon, token, "/api/v1/history", node=running, limit=2)
    assert len(first["items"]) == 2 and first["next_cursor"] == first["items"][-1]["transition"]
    rest = api_get(daemon, token, "/api/v1/history", node=running, limit=500,
                   cursor=first["next_cursor"])
    assert [r["transition"] for r in first["items"] + rest["items"]] == ids
    assert rest["next_cursor"] is None
    resumed = api_get(daemon, token, "/api/v1/history", node=running, order="oldest",
                      cursor=ids[-1])
    assert [r["transition"] for r in resumed["items"]] == ids[::-1][1:]
    two = cli("audit", "--node", running, "--limit", "2").stdout.splitlines()
    assert two == lines[:2]
    bad = cli("audit", "--since", "yesterday", ok=False)
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr
