"""``provisioner import FILE --dry-run``, brownfield adoption, live-node protection and the
re-image confirmation, through the CLI against a real daemon (issue 30, items 2, 3, 9) with
the default auto_inspect/auto_deploy policies on and a profile registry."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_cli_api import (
    Daemon,
    as_json,
    new_token,
    one_line_error,
    run_cli,
    running_daemon,
)

pytestmark = pytest.mark.e2e

SETTINGS = (
    "[simulation]\nstep_delay_s = 0.01\n\n"
    "[validation.profiles.gpu-worker]\ngpu_count = 8\n"
)
RACK = """\
serial,hostname,rack,profile,macs,bmc_driver,bmc_address,state
BF-E1,run-e1,rack-bf,gpu-worker,52:54:00:30:e0:01,fake,SIM-BF1,active
BF-E2,new-e2,rack-bf,gpu-worker,52:54:00:30:e0:02,,,
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("e2e-import"), SETTINGS) as running:
        yield running


@pytest.fixture(scope="module")
def cli(daemon: Daemon) -> Any:
    token = new_token(daemon, "operator", "e2e-importer")

    def call(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        result = run_cli(daemon, *args, token=token)
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    return call


def test_dry_run_then_import_registers_the_running_machine(cli: Any, daemon: Daemon) -> None:
    rack = daemon.root / "rack.csv"
    rack.write_text(RACK)
    dry = cli("import", str(rack), "--dry-run")
    lines = dry.stdout.splitlines()
    assert lines[0] == "BF-E1: create"
    assert "  register running as active (no inspection, no disk write)" in lines
    assert "BF-E2: create" in lines and "  hostname: new-e2" in lines
    assert lines[-1] == "would create 2, would update 0, errors 0 (dry run: nothing changed)"
    assert as_json(cli("node", "list", "--json")) == []

    assert cli("import", str(rack)).stdout.strip() == "created 2, updated 0, errors 0"
    time.sleep(1.0)  # auto_inspect and auto_deploy are on: they had their chance
    running = as_json(cli("node", "show", "run-e1", "--json"))
    assert running["state"] == "active"
    assert [(h["event"], h["to_state"], h["actor"]) for h in running["history"]] == [
        ("enroll", "active", "token:e2e-importer")]


def test_a_live_node_is_renamed_only_with_the_flag(cli: Any, daemon: Daemon) -> None:
    rename = daemon.root / "rename.csv"
    rename.write_text("serial,hostname\nBF-E1,renamed-e1\n")
    refused = cli("import", str(rename), ok=False)
    assert refused.returncode == 1
    assert "is active" in refused.stderr and "allow_live_changes" in refused.stderr
    assert as_json(cli("node", "show", "BF-E1", "--json"))["hostname"] == "run-e1"
    dry = cli("import", str(rename), "--dry-run", "--allow-live-changes")
    assert "  hostname: run-e1 -> renamed-e1" in dry.stdout.splitlines()
    assert as_json(cli("node", "show", "BF-E1", "--json"))["hostname"] == "run-e1"
    done = cli("import", str(rename), "--allow-live-changes")
    assert done.stdout.splitlines()[-1] == "created 0, updated 1, errors 0"
    node = as_json(cli("node", "show", "BF-E1", "--json"))
    assert node["hostname"] == "renamed-e1"
    assert [(h["event"], h["actor"], h["reason"]) for h in node["history"]][-1] == (
        "import", "token:e2e-importer", "hostname: run-e1 -> renamed-e1")


def test_reimaging_an_active_node_needs_yes(cli: Any) -> None:
    error = one_line_error(cli("node", "action", "renamed-e1", "deploy", ok=False))
    assert "renamed-e1 is active" in error and "erasing its disks" in error
    assert as_json(cli("node", "show", "renamed-e1", "--json"))["state"] == "active"
    accepted = cli("node", "action", "renamed-e1", "deploy", "--yes")
    assert accepted.stdout.startswith("renamed-e1: deploy accepted")


def test_an_unknown_profile_is_rejected(cli: Any, daemon: Daemon) -> None:
    typo = daemon.root / "typo.csv"
    typo.write_text("serial,profile\nTYPO-1,gpu-wroker\n")
    error = one_line_error(cli("import", str(typo), ok=False))
    assert "row 1" in error and "unknown profile 'gpu-wroker'" in error
    assert "gpu-worker" in error
    assert [n["serial"] for n in as_json(cli("node", "list", "--json"))
            if n["serial"] == "TYPO-1"] == []
