"""Node edit, delete, replace, bulk actions and the list's columns through the CLI against a
real daemon (``provisioner serve`` as a subprocess, fake drivers): issue 30 items 4, 5, 8."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_api import STATE_DEADLINE_S, as_json, one_line_error
from tests.e2e.test_cli_api import cli as cli  # noqa: F401  (fixtures)
from tests.e2e.test_cli_api import daemon as daemon  # noqa: F401
from tests.e2e.test_cli_api import token as token  # noqa: F401

pytestmark = pytest.mark.e2e


def _wait_state(cli: Any, node: str, state: str) -> dict[str, Any]:  # noqa: F811
    deadline = time.monotonic() + STATE_DEADLINE_S
    detail: dict[str, Any] = as_json(cli("node", "show", node, "--json"))
    while detail["state"] != state and time.monotonic() < deadline:
        time.sleep(0.2)
        detail = as_json(cli("node", "show", node, "--json"))
    assert detail["state"] == state, detail
    return detail


def _enroll(cli: Any, hostname: str | None, serial: str, mac: str,  # noqa: F811
            *more: str) -> dict[str, Any]:
    args = ["node", "enroll", "--serial", serial, "--mac", mac, "--bmc-driver", "fake",
            "--bmc-address", f"SIM-{serial}", "--json", *more]
    if hostname:
        args += ["--hostname", hostname]
    node: dict[str, Any] = as_json(cli(*args))
    return node


def test_edit_records_history_and_guards_a_live_rename(cli: Any) -> None:  # noqa: F811
    _enroll(cli, "adm-e1", "ADM-E1", "52:54:00:ad:00:01", "--rack", "r1")
    out = cli("node", "edit", "adm-e1", "--rack", "r12", "--position", "u4",
              "--reason", "moved").stdout
    assert out.strip() == "adm-e1: rack r12, position u4"
    history = as_json(cli("node", "history", "adm-e1", "--json"))
    edits = [(h["event"], h["actor"], h["reason"]) for h in history if h["event"] == "edit"]
    assert edits == [("edit", "token:e2e-admin", "position (none) -> 'u4': moved"),
                     ("edit", "token:e2e-admin", "rack 'r1' -> 'r12': moved")]
    nothing = cli("node", "edit", "adm-e1", ok=False)
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr


def test_delete_only_retired_and_replace_a_chassis(cli: Any, tmp_path: Path) -> None:  # noqa: F811
    old = _enroll(cli, "adm-r1", "ADM-OLD", "52:54:00:ad:01:01", "--rack", "r7",
                  "--position", "u9", "--profile", "gpu-worker")
    refused = one_line_error(cli("node", "delete", "adm-r1", ok=False))
    assert "enrolled" in refused and "retired" in refused
    cli("node", "action", "adm-r1", "retire", "--reason", "RMA")
    _wait_state(cli, "adm-r1", "retired")
    new = _enroll(cli, None, "ADM-NEW", "52:54:00:ad:01:02")

    out = cli("node", "replace", "adm-r1", "--with", "ADM-NEW", "--reason", "RMA 7").stdout
    assert out.startswith(f"adm-r1: now node {new['id']} (serial ADM-NEW, rack r7, position u9)")
    moved = as_json(cli("node", "show", "adm-r1", "--json"))
    assert (moved["id"], moved["profile"]) == (new["id"], "gpu-worker")
    assert moved["history"][-1]["event"] == "replaces" and old["id"] in \
        moved["history"][-1]["reason"]
    freed = as_json(cli("node", "show", old["id"], "--json"))
    assert (freed["hostname"], freed["serial"], freed["macs"]) == (None, None, [])
    assert freed["history"][-1]["event"] == "replaced_by"
    _enroll(cli, None, "ADM-OLD", "52:54:00:ad:01:01")  # serial and MAC are free again

    exported = tmp_path / "old.json"
    out = cli("node", "delete", old["id"], "--history-file", str(exported)).stdout
    assert f"deleted {old['id']}" in out and str(exported) in out
    record = json.loads(exported.read_text())
    assert [h["event"] for h in record["history"]][-1] == "replaced_by"
    assert record["node"]["id"] == old["id"]
    gone = one_line_error(cli("node", "show", old["id"], ok=False))
    assert "not found" in gone or "no node" in gone


def test_bulk_action_dry_run_cap_and_apply(cli: Any) -> None:  # noqa: F811
    for index in range(3):
        _enroll(cli, f"adm-b{index}", f"ADM-B{index}", f"52:54:00:ad:02:0{index}",
                "--rack", "bulk-r")
    _enroll(cli, "adm-b9", "ADM-B9", "52:54:00:ad:02:09", "--rack", "bulk-s")
    flt = ("--filter", "rack=bulk-r,rack=bulk-s", "--filter", "state=enrolled")
    preview = cli("node", "action", *flt, "maintenance-on", "--reason", "fw", "--dry-run")
    assert preview.stdout.splitlines()[0] == "dry run: maintenance-on would apply to 4 node(s)"
    assert sorted(line.split()[0] for line in preview.stdout.splitlines()[2:]) == \
        ["adm-b0", "adm-b1", "adm-b2", "adm-b9"]
    listed = as_json(cli("node", "list", "--rack", "bulk-r,bulk-s", "--json"))
    assert not any(n["maintenance"] for n in listed)

    capped = one_line_error(cli("node", "action", *flt, "maintenance-on", "--reason", "fw",
                                "--max", "3", ok=False))
    assert "4 nodes match" in capped and "max 3" in capped
    done = cli("node", "action", *flt, "maintenance-on", "--reason", "fw").stdout
    assert len(done.splitlines()) == 4 and "maintenance-on accepted" in done
    both = as_json(cli("node", "list", "--rack", "bulk-r", "--rack", "bulk-s",
                       "--maintenance", "--json"))
    assert sorted(n["hostname"] for n in both) == ["adm-b0", "adm-b1", "adm-b2", "adm-b9"]
    failed = cli("node", "action", "--filter", "rack=bulk-s", "deploy", ok=False)
    assert failed.returncode == 1 and "adm-b9:" in failed.stderr
    both_forms = cli("node", "action", "adm-b9", "retry", "--filter", "rack=x", ok=False)
    assert both_forms.returncode == 2


def test_list_columns_sort_and_hardware(cli: Any) -> None:  # noqa: F811
    _enroll(cli, "adm-h1", "ADM-H1", "52:54:00:ad:03:01", "--rack", "hw-r")
    _enroll(cli, "adm-h10", "ADM-H10", "52:54:00:ad:03:10", "--rack", "hw-r")
    _enroll(cli, "adm-h2", "ADM-H2", "52:54:00:ad:03:02", "--rack", "hw-r")
    cli("node", "action", "adm-h2", "inspect")
    detail = _wait_state(cli, "adm-h2", "inspected")
    assert detail["hardware"] and "items" not in detail["hardware"]
    out = cli("node", "list", "--rack", "hw-r", "--columns", "hostname,power,hardware,error",
              "--sort", "hostname").stdout.splitlines()
    assert out[0].split() == ["HOSTNAME", "POWER", "HARDWARE", "ERROR"]
    assert [line.split()[0] for line in out[1:]] == ["adm-h1", "adm-h2", "adm-h10"]
    assert detail["hardware"] in out[2]
    shown = cli("node", "show", "adm-h2").stdout
    assert "hardware:" in shown and detail["hardware"] in shown and "power_state:" in shown
    bad = cli("node", "list", "--columns", "hostname,bogus", ok=False)
    assert bad.returncode == 2 and "bogus" in bad.stderr


def test_bulk_action_waits_for_each_node(cli: Any) -> None:  # noqa: F811
    for index in range(2):
        _enroll(cli, f"adm-w{index}", f"ADM-W{index}", f"52:54:00:ad:04:0{index}",
                "--rack", "wait-r")
    done = cli("node", "action", "--filter", "rack=wait-r", "inspect", "--wait").stdout
    lines = done.splitlines()
    assert sorted(lines[:2]) == ["adm-w0: inspect accepted; state inspecting",
                                 "adm-w1: inspect accepted; state inspecting"]
    assert sorted(lines[2:]) == ["adm-w0: inspected", "adm-w1: inspected"]
    listed = as_json(cli("node", "list", "--rack", "wait-r", "--json"))
    assert {n["state"] for n in listed} == {"inspected"}
    for extra in ("--json", "--dry-run"):
        refused = cli("node", "action", "--filter", "rack=wait-r", "inspect", "--wait", extra,
                      ok=False)
        assert refused.returncode == 2 and "--wait with --filter" in refused.stderr
