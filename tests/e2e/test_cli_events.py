"""``provisioner events`` and ``node action --wait`` against a real daemon (SQLite), and the
event stream of two daemons on one PostgreSQL: each daemon's clients see both daemons'
transitions, and a reconnect with ``Last-Event-ID`` resumes without a gap or a repeat."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.simulation.drivers import FAULT
from provisioner.simulation.world import SimWorld
from tests.e2e.test_cli_api import (
    Daemon,
    as_json,
    clean_env,
    new_token,
    run_cli,
    running_daemon,
)

pytestmark = pytest.mark.e2e

LINE = re.compile(r"^#(\d+) \S+ (\S+) \((\S+)\) (.+) by (\S+?)(?::|$| \[)")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("events")) as running:
        yield running


@pytest.fixture(scope="module")
def cli(daemon: Daemon) -> Any:
    token = new_token(daemon, "admin", "events-admin")

    def call(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        result = run_cli(daemon, *args, token=token)
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    call.token = token  # type: ignore[attr-defined]
    return call


def _enroll(cli: Any, name: str, n: int) -> dict[str, Any]:
    node: dict[str, Any] = as_json(cli(
        "node", "enroll", "--hostname", name, "--serial", f"EV{n:04d}", "--mac",
        f"52:54:00:ee:00:{n:02x}", "--bmc-driver", "fake", "--bmc-address", f"ev-{n}", "--json"))
    return node


def _lines(result: subprocess.CompletedProcess[str]) -> list[re.Match[str]]:
    found = [LINE.match(line) for line in result.stdout.splitlines()]
    assert all(found), result.stdout
    return [m for m in found if m is not None]


def test_wait_for_inspection_then_events_resume_with_since(cli: Any) -> None:
    node = _enroll(cli, "ev-01", 1)
    done = cli("node", "action", "ev-01", "inspect", "--wait", "--wait-timeout", "60")
    assert done.stdout.splitlines() == ["ev-01: inspect accepted; state inspecting",
                                        "ev-01: inspected"]
    lines = _lines(cli("events", "--node", "ev-01"))
    changes = [m.group(4) for m in lines]
    assert changes == ["enroll (enrolled)", "enrolled --inspect--> inspecting",
                       "inspecting --done--> inspected"]
    assert {m.group(2) for m in lines} == {"ev-01"} and {m.group(3) for m in lines} == {
        node["id"]}
    ids = [int(m.group(1)) for m in lines]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    after_first = _lines(cli("events", "--node", node["id"], "--since", str(ids[0])))
    assert [int(m.group(1)) for m in after_first] == ids[1:]
    assert _lines(cli("events", "--node", "ev-01", "--since", str(ids[-1]))) == []
    assert [int(m.group(1)) for m in _lines(cli("events", "--node", "ev-01", "--last", "1"))
            ] == ids[-1:]
    as_objects = [json.loads(line) for line in cli("events", "--node", "ev-01", "--json"
                                                   ).stdout.splitlines()]
    assert [o["transition"] for o in as_objects] == ids
    assert as_objects[-1]["state"] == "inspected" and as_objects[-1]["hostname"] == "ev-01"


def test_wait_exits_0_on_active_and_1_with_the_last_error(daemon: Daemon, cli: Any) -> None:
    for n in (2, 4):
        _enroll(cli, f"ev-0{n}", n)
        cli("node", "action", f"ev-0{n}", "inspect", "--wait", "--wait-timeout", "60")
    deployed = cli("node", "action", "ev-02", "deploy", "--wait", "--wait-timeout", "120")
    assert deployed.stdout.splitlines()[-1] == "ev-02: active"
    world = SimWorld(daemon.root / "state" / "simworld.sqlite")  # the simulated machine
    try:
        asyncio.run(world.ensure("ev-4", "inject", FAULT, "xid79"))
    finally:
        world.close()
    failed = cli("node", "action", "ev-04", "deploy", "--wait", "--wait-timeout", "120",
                 ok=False)
    detail = as_json(cli("node", "show", "ev-04", "--json"))
    assert detail["state"] == "validate_failed", detail
    assert failed.returncode == 1, failed
    assert failed.stderr.strip() == (f"provisioner: error: ev-04: deploy ended in "
                                     f"validate_failed: {detail['last_error']}")
    assert "simulated fault (xid79)" in detail["last_error"]


def test_follow_prints_each_transition_as_it_happens(daemon: Daemon, cli: Any) -> None:
    _enroll(cli, "ev-03", 3)
    env = clean_env() | {"PROVISIONER_URL": daemon.url, "PROVISIONER_TOKEN": cli.token}
    follower = subprocess.Popen(
        [sys.executable, "-m", "provisioner", "events", "--follow", "--node", "ev-03",
         "--last", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    out = follower.stdout
    assert out is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(out.readline, "")), daemon=True)
    reader.start()
    try:
        time.sleep(1.0)  # connected
        cli("node", "action", "ev-03", "maintenance-on", "--reason", "cable swap")
        cli("node", "action", "ev-03", "maintenance-off")
        deadline = time.monotonic() + 15
        while len(lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        follower.terminate()
        follower.wait(10)
    assert len(lines) == 2, (lines, follower.stderr.read() if follower.stderr else "")
    assert "ev-03" in lines[0] and "maintenance_on (enrolled)" in lines[0]
    assert "by token:events-admin: cable swap [" in lines[0]  # actor, reason, daemon
    assert "maintenance_off (enrolled)" in lines[1]


def test_the_stream_rejects_a_bad_since(daemon: Daemon, cli: Any) -> None:
    request = urllib.request.Request(f"{daemon.url}/api/v1/events?since=abc",
                                     headers={"Authorization": f"Bearer {cli.token}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 422
    bad = cli("events", "--since", "x", ok=False)
    assert bad.returncode == 2


def test_maintenance_on_again_with_a_new_reason_records_it(cli: Any) -> None:
    _enroll(cli, "ev-05", 5)
    cli("node", "action", "ev-05", "maintenance-on", "--reason", "cable swap")
    cli("node", "action", "ev-05", "maintenance-on", "--reason", "cable swap")  # the same
    cli("node", "action", "ev-05", "maintenance-on", "--reason", "PSU replaced too")
    detail = as_json(cli("node", "show", "ev-05", "--json"))
    assert detail["maintenance"] is True
    assert detail["maintenance_reason"] == "PSU replaced too"
    reasons = [h["reason"] for h in as_json(cli("node", "history", "ev-05", "--json"))
               if h["event"] == "maintenance_on"]
    assert reasons == ["cable swap", "PSU replaced too"]
    lines = cli("events", "--node", "ev-05").stdout.splitlines()
    assert lines[-1].split(" by ", 1)[1].startswith("token:events-admin: PSU replaced too")


def test_a_replaced_chassis_lines_keep_the_hostname_it_had(cli: Any) -> None:
    """After ``node replace``, the old chassis has no hostname; its event and audit lines
    still name it by the one it had (not ``-``), its id telling it from the new chassis."""
    old = _enroll(cli, "ev-07", 7)
    cli("node", "action", "ev-07", "retire", "--reason", "RMA 7", "--wait")
    new = as_json(cli("node", "enroll", "--hostname", "ev-07-new", "--serial", "EV0107",
                      "--mac", "52:54:00:ee:01:07", "--bmc-driver", "fake", "--bmc-address",
                      "ev-107", "--json"))
    cli("node", "edit", new["id"], "--hostname", "ev-spare")  # a name it gives up below
    cli("node", "replace", "ev-07", "--with", "EV0107", "--reason", "RMA 7")
    assert as_json(cli("node", "show", old["id"], "--json"))["hostname"] is None
    lines = cli("events", "--last", "40").stdout.splitlines()
    names = {(m.group(3), m.group(2)) for m in map(LINE.match, lines)
             if m is not None and m.group(3) in (old["id"], new["id"])}
    assert {name for node, name in names if node == old["id"]} == {"ev-07"}, lines
    assert {name for node, name in names if node == new["id"]} == {"ev-07"}, lines
    events = [m.group(4) for m in map(LINE.match, lines)
              if m is not None and m.group(3) == old["id"]]
    assert events[0] == "enroll (enrolled)" and events[-1] == "replaced_by (retired)", events
    audit = cli("audit", "--node", old["id"]).stdout
    assert " - (" not in audit and f"ev-07 ({old['id']})" in audit, audit
