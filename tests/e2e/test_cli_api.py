"""The CLI against a real daemon: ``provisioner serve`` as a subprocess, the CLI as others.

The daemon runs on a random loopback port with the shipped ``fake`` drivers, so a node
enrolled with ``--bmc-driver fake`` can really be inspected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ports import free_tcp_port, stop_process

pytest.importorskip("provisioner.daemon")

pytestmark = pytest.mark.e2e

BMC_PASSWORD = "Sup3r-s3cret-BMC-pw"  # must never appear in any output
START_DEADLINE_S = 20.0
STATE_DEADLINE_S = 30.0


@dataclass(frozen=True)
class Daemon:
    url: str
    config: Path
    root: Path
    log: Path



def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"daemon exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    pytest.fail(f"daemon not healthy after {START_DEADLINE_S} s:\n{log.read_text()[-3000:]}")


CLI_SETTINGS = (
    "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n\n"
    "[simulation]\nstep_delay_s = 0.01\n\n"
    "[bmc]\npower_sync_interval_s = 1\n"  # test_cli_power sees out-of-band changes
)


@contextmanager
def running_daemon(root: Path, settings: str = CLI_SETTINGS) -> Iterator[Daemon]:
    """``provisioner serve`` on a free loopback port with ``settings`` (TOML sections),
    stopped with SIGTERM at the end."""
    port = free_tcp_port()
    root.mkdir(parents=True, exist_ok=True)
    config = root / "provisioner.toml"
    config.write_text(f'state_dir = "{root / "state"}"\n\n'
                      f'[api]\nlisten = "127.0.0.1:{port}"\n\n{settings}')
    log = root / "daemon.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "provisioner", "--config", str(config), "serve"],
            stdout=log_file, stderr=subprocess.STDOUT, env=clean_env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield Daemon(url=url, config=config, root=root, log=log)
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("e2e-cli")) as running:
        yield running


def run_cli(daemon: Daemon, *args: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = clean_env() | {"PROVISIONER_URL": daemon.url}
    if token is not None:
        env["PROVISIONER_TOKEN"] = token
    result = subprocess.run([sys.executable, "-m", "provisioner", *args], capture_output=True,
                            text=True, timeout=60, env=env, check=False)
    assert BMC_PASSWORD not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def new_token(daemon: Daemon, role: str, name: str) -> str:
    result = run_cli(daemon, "--config", str(daemon.config), "token", "create",
                     "--role", role, "--name", name, token=None)
    assert result.returncode == 0, result.stderr
    token = result.stdout.splitlines()[-1]
    assert token.startswith("pvt_")
    return token


@pytest.fixture(scope="module")
def token(daemon: Daemon) -> str:
    return new_token(daemon, "admin", "e2e-admin")


@pytest.fixture
def cli(daemon: Daemon, token: str) -> Any:
    def call(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        result = run_cli(daemon, *args, token=token)
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    return call


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    assert result.stderr.startswith("provisioner: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def enrolled(daemon: Daemon, token: str) -> dict[str, Any]:
    password_file = daemon.root / "bmc-password"
    password_file.write_text(BMC_PASSWORD + "\n")
    result = run_cli(
        daemon, "node", "enroll", "--hostname", "gpu-e2e-01", "--serial", "E2E0001",
        "--mac", "52:54:00:e2:e0:01", "--mac", "52:54:00:e2:e0:02", "--profile", "gpu-worker",
        "--rack", "rack-e2e", "--position", "7", "--bmc-driver", "fake", "--bmc-address",
        "SIM1", "--bmc-username", "admin", "--bmc-password-file", str(password_file), "--json",
        token=token)
    assert result.returncode == 0, result.stderr
    node: dict[str, Any] = json.loads(result.stdout)
    return node


def test_enroll(enrolled: dict[str, Any]) -> None:
    assert enrolled["hostname"] == "gpu-e2e-01"
    assert enrolled["serial"] == "E2E0001"
    assert enrolled["macs"] == ["52:54:00:e2:e0:01", "52:54:00:e2:e0:02"]
    assert enrolled["state"] == "enrolled"
    assert enrolled["bmc"]["driver"] == "fake"
    assert enrolled["bmc"]["password_set"] is True
    assert "password" not in enrolled["bmc"]


def test_enroll_human_output(cli: Any) -> None:
    result = cli("node", "enroll", "--hostname", "gpu-e2e-02", "--serial", "E2E0002",
                 "--mac", "52:54:00:e2:e0:03")
    assert result.stdout.startswith("enrolled gpu-e2e-02: id ")
    assert result.stdout.rstrip().endswith("state enrolled")


def test_node_list_table_and_json(cli: Any, enrolled: dict[str, Any]) -> None:
    table = cli("node", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "HOSTNAME", "SERIAL", "STATE", "STEP", "MAINT", "POWER",
                                "RACK", "PROFILE", "HARDWARE", "ERROR"]
    row = next(line for line in table if "gpu-e2e-01" in line)
    assert row.split()[:4] == [enrolled["id"][:8], "gpu-e2e-01", "E2E0001", "enrolled"]

    items = as_json(cli("node", "list", "--json"))
    assert isinstance(items, list)
    mine = next(item for item in items if item["id"] == enrolled["id"])
    assert {"id", "hostname", "state", "serial", "macs", "maintenance"} <= mine.keys()

    filtered = as_json(cli("node", "list", "--rack", "rack-e2e", "--json"))
    assert [item["hostname"] for item in filtered] == ["gpu-e2e-01"]
    assert as_json(cli("node", "list", "-q", "E2E0001", "--json"))[0]["id"] == enrolled["id"]


def test_node_list_all_follows_pagination(cli: Any) -> None:
    everything = as_json(cli("node", "list", "--json"))
    assert len(everything) >= 2
    paged = as_json(cli("node", "list", "--all", "--limit", "1", "--json"))
    assert sorted(n["id"] for n in paged) == sorted(n["id"] for n in everything)
    one = cli("node", "list", "--limit", "1")
    assert len(one.stdout.splitlines()) == 2
    assert f"1 of {len(everything)} nodes" in one.stderr


@pytest.mark.parametrize("key", ["gpu-e2e-01", "E2E0001", "52:54:00:e2:e0:02"],
                         ids=["hostname", "serial", "mac"])
def test_node_show_by_any_key(cli: Any, enrolled: dict[str, Any], key: str) -> None:
    detail = as_json(cli("node", "show", key, "--json"))
    assert detail["id"] == enrolled["id"]
    assert "facts" in detail
    assert isinstance(detail["history"], list) and detail["history"]
    assert "inspect" in detail["allowed_actions"]

    text = cli("node", "show", key).stdout
    assert "hostname:" in text and "gpu-e2e-01" in text
    assert "fake SIM1 (user admin, password set)" in text
    assert "history:" in text


def test_inspect_until_inspected(cli: Any, enrolled: dict[str, Any]) -> None:
    result = cli("node", "action", "gpu-e2e-01", "inspect", "--reason", "e2e inspection")
    assert result.stdout.startswith("gpu-e2e-01: inspect accepted; state ")

    deadline = time.monotonic() + STATE_DEADLINE_S
    detail = as_json(cli("node", "show", enrolled["id"], "--json"))
    while detail["state"] != "inspected" and time.monotonic() < deadline:
        assert detail["state"] in ("enrolled", "inspecting"), detail
        time.sleep(0.2)
        detail = as_json(cli("node", "show", enrolled["id"], "--json"))
    assert detail["state"] == "inspected", detail
    assert detail["facts"], "inspection should have recorded facts"

    history = as_json(cli("node", "history", "gpu-e2e-01", "--json"))
    assert [(h["from_state"], h["to_state"]) for h in history][-2:] == [
        ("enrolled", "inspecting"), ("inspecting", "inspected")]
    assert any(h["reason"] == "e2e inspection" for h in history)

    table = cli("node", "history", "gpu-e2e-01").stdout.splitlines()
    assert table[0].split() == ["SEQ", "AT", "EVENT", "FROM", "TO", "ACTOR", "REASON"]
    assert any("inspected" in line for line in table[1:])

    text = cli("node", "show", "gpu-e2e-01").stdout
    assert "facts:" in text and "(none)" not in text.split("facts:")[1].split("history:")[0]


def test_maintenance_on_and_off(cli: Any) -> None:
    node = as_json(cli("node", "action", "gpu-e2e-02", "maintenance-on", "--reason",
                       "fan swap", "--json"))
    assert node["maintenance"] is True
    in_maint = as_json(cli("node", "list", "--maintenance", "--json"))
    assert "gpu-e2e-02" in [n["hostname"] for n in in_maint]
    out_of_maint = as_json(cli("node", "list", "--no-maintenance", "--json"))
    assert "gpu-e2e-02" not in [n["hostname"] for n in out_of_maint]
    assert as_json(cli("node", "show", "gpu-e2e-02", "--json"))["maintenance_reason"] == (
        "fan swap")
    cli("node", "action", "gpu-e2e-02", "maintenance-off")
    assert as_json(cli("node", "show", "gpu-e2e-02", "--json"))["maintenance"] is False


def test_import_csv(cli: Any, daemon: Daemon) -> None:
    csv = daemon.root / "expected.csv"
    csv.write_text("serial,hostname,rack,profile\n"
                   "IMP0001,gpu-imp-01,rack-imp,gpu-worker\n"
                   "IMP0002,gpu-imp-02,rack-imp,gpu-worker\n")
    result = cli("import", str(csv))
    assert result.stdout.strip() == "created 2, updated 0, errors 0"

    imported = as_json(cli("node", "list", "--rack", "rack-imp", "--json"))
    assert sorted(n["serial"] for n in imported) == ["IMP0001", "IMP0002"]
    assert as_json(cli("node", "show", "IMP0002", "--json"))["hostname"] == "gpu-imp-02"

    report = as_json(cli("import", str(csv), "--json"))  # the same rows: nothing to write
    assert (len(report["created"]), len(report["updated"]), report["errors"]) == (0, 0, [])
    assert {change["action"] for change in report["changes"]} == {"unchanged"}


def test_import_json_and_invalid_rows(cli: Any, daemon: Daemon) -> None:
    doc = daemon.root / "expected.json"
    doc.write_text(json.dumps([{"serial": "IMP0101", "hostname": "gpu-imp-101",
                                "rack": "rack-json"}]))
    assert cli("import", str(doc)).stdout.strip() == "created 1, updated 0, errors 0"
    assert as_json(cli("node", "show", "IMP0101", "--json"))["rack"] == "rack-json"

    bad = daemon.root / "bad.csv"
    bad.write_text("serial,hostname\n,no-serial-1\n,no-serial-2\n")
    error = one_line_error(cli("import", str(bad), ok=False))
    assert "row 1" in error and "row 2" in error


def test_invalid_transition_names_the_state(cli: Any) -> None:
    result = cli("node", "action", "gpu-e2e-02", "deploy", ok=False)
    error = one_line_error(result)
    assert "enrolled" in error
    assert result.stdout == ""


def test_unknown_node(cli: Any) -> None:
    error = one_line_error(cli("node", "show", "no-such-node", ok=False))
    assert "no-such-node" in error
    one_line_error(cli("node", "action", "no-such-node", "inspect", ok=False))


def test_no_token_or_bad_token(daemon: Daemon) -> None:
    error = one_line_error(run_cli(daemon, "node", "list", token=None))
    assert "PROVISIONER_TOKEN" in error
    one_line_error(run_cli(daemon, "node", "list", token="pvt_not-a-real-token"))


def test_viewer_cannot_act(daemon: Daemon) -> None:
    viewer = new_token(daemon, "viewer", "e2e-viewer")
    assert run_cli(daemon, "node", "list", "--json", token=viewer).returncode == 0
    one_line_error(run_cli(daemon, "node", "action", "gpu-e2e-02", "maintenance-on",
                           token=viewer))


def test_token_file(daemon: Daemon, token: str) -> None:
    token_file = daemon.root / "token"
    token_file.write_text(token + "\n")
    result = run_cli(daemon, "node", "list", "--json", "--token-file", str(token_file),
                     token=None)
    assert result.returncode == 0, result.stderr


def test_password_never_in_daemon_log(daemon: Daemon, enrolled: dict[str, Any]) -> None:
    assert BMC_PASSWORD not in daemon.log.read_text(errors="replace")
