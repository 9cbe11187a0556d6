"""The dynamic inventory against a running daemon: ``provisioner serve`` as a subprocess with a
simulated fleet of 30 (their GPU facts come from inspection) and one real node enrolled by
the CLI; ``ansible-inventory --list -i inventory/provisioner.py`` must accept the output, read
with one request per page of nodes (the daemon's own request counter on ``/metrics``)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_api import BMC_PASSWORD, Daemon, clean_env, running_daemon

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "inventory" / "provisioner.py"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    settings = ("[lifecycle]\nauto_deploy = false\n\n"
                "[simulation]\nnodes = 30\nracks = 3\nstep_delay_s = 0.01\n\n"
                "[daemon]\nshutdown_timeout_s = 1\n")  # the real node's inspection never ends
    with running_daemon(tmp_path_factory.mktemp("e2e-inventory"), settings) as running:
        yield running


def cli(daemon: Daemon, *args: str, token: str | None = None) -> str:
    env = clean_env() | {"PROVISIONER_URL": daemon.url} | (
        {"PROVISIONER_TOKEN": token} if token else {})
    result = subprocess.run([sys.executable, "-m", "provisioner", *args], capture_output=True,
                            text=True, timeout=60, env=env, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def viewer(daemon: Daemon) -> str:
    admin = cli(daemon, "--config", str(daemon.config), "token", "create", "--role", "admin",
                "--name", "inv-admin").splitlines()[-1]
    password = daemon.root / "bmc-password"
    password.write_text(BMC_PASSWORD)
    cli(daemon, "node", "enroll", "--hostname", "gpu-real-01", "--serial", "REAL0001",
        "--mac", "52:54:00:aa:00:01", "--rack", "rack-7", "--profile", "gpu-worker",
        # loopback only: the daemon inspects it and talks IPMI to that address
        "--bmc-driver", "ipmi", "--bmc-address", "127.0.0.9", "--bmc-username", "admin",
        "--bmc-password-file", str(password), token=admin)
    return cli(daemon, "--config", str(daemon.config), "token", "create", "--role", "viewer",
               "--name", "inventory").splitlines()[-1]


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = clean_env() | {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin"} | env
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                            check=False)
    assert BMC_PASSWORD not in result.stdout + result.stderr
    return result


def ansible_inventory(daemon: Daemon, token: str, *args: str) -> Any:
    result = run([str(BIN / "ansible-inventory"), "-i", str(SCRIPT), *args],
                 {"PROVISIONER_URL": daemon.url, "PROVISIONER_TOKEN": token})
    assert result.returncode == 0, result.stderr
    assert "[WARNING]" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def plain(value: Any) -> Any:
    """Host vars as the script means them: it marks every string unsafe (never templated),
    which ``ansible-inventory`` shows as ``{"__ansible_unsafe": "..."}``."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def test_ansible_inventory_accepts_the_output(daemon: Daemon, viewer: str) -> None:
    deadline = time.monotonic() + 60
    while True:  # the simulated nodes are inspected (GPU facts) within a second or two
        listed = ansible_inventory(daemon, viewer, "--list")
        gpu_hosts = listed.get("gpu_nvidia_h100_80gb_hbm3", {}).get("hosts", [])
        if len(gpu_hosts) == 30 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(gpu_hosts) == [f"sim-r{r:02d}-n{n:03d}" for r in (1, 2, 3)
                                 for n in range(1, 11)]
    assert listed["rack_r01"]["hosts"] == [f"sim-r01-n{n:03d}" for n in range(1, 11)]
    assert "gpu-real-01" in listed["rack_rack_7"]["hosts"]
    assert "gpu-real-01" in listed["profile_gpu_worker"]["hosts"]
    assert any(group.startswith("state_") for group in listed)
    assert set(listed["all"]["children"]) >= {"rack_r01", "rack_r03", "profile_gpu_worker",
                                              "gpu_nvidia_h100_80gb_hbm3", "ungrouped"}
    real = plain(listed["_meta"]["hostvars"]["gpu-real-01"])
    assert real["provisioner_serial"] == "REAL0001"
    assert real["provisioner_bmc_address"] == "127.0.0.9"
    assert real["provisioner_rack"] == "rack-7" and real["provisioner_gpu_model"] is None
    sim = plain(listed["_meta"]["hostvars"]["sim-r01-n001"])
    assert sim["provisioner_gpu_count"] == 8 and len(sim["provisioner_node_id"]) == 36
    assert "password" not in json.dumps(listed).lower().replace("password_set", "")

    host = plain(ansible_inventory(daemon, viewer, "--host", "gpu-real-01"))
    assert host["provisioner_serial"] == "REAL0001"


def test_script_reads_a_config_file_and_fails_clearly(
        daemon: Daemon, viewer: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(viewer + "\n")
    config = tmp_path / "inventory.toml"
    config.write_text(f'url = "{daemon.url}/api/v1"\ntoken_file = "{token_file}"\n')
    result = run([sys.executable, str(SCRIPT), "--list"],
                 {"PROVISIONER_INVENTORY_CONFIG": str(config)})
    assert result.returncode == 0, result.stderr
    assert "gpu-real-01" in json.loads(result.stdout)["_meta"]["hostvars"]

    result = run([sys.executable, str(SCRIPT), "--list"],
                 {"PROVISIONER_URL": daemon.url, "PROVISIONER_TOKEN": "pvt_wrong"})
    assert result.returncode == 1
    assert result.stderr.startswith("provisioner inventory: error: GET /nodes: HTTP 401")
    assert result.stderr.count("\n") == 1 and "pvt_wrong" not in result.stderr

    result = run([sys.executable, str(SCRIPT), "--list"],
                 {"PROVISIONER_INVENTORY_CONFIG": str(tmp_path / "missing.toml")})
    assert result.returncode == 1 and "missing.toml does not exist" in result.stderr


def requests_served(daemon: Daemon, status: int = 200) -> dict[str, int]:
    """GET requests per route so far, from the daemon's ``provisioner_api_request_seconds``."""
    with urllib.request.urlopen(f"{daemon.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, int] = {}
    for route, value in re.findall(r'^provisioner_api_request_seconds_count\{method="GET",'
                                   rf'route="([^"]+)",status="{status}"\}} (\S+)$', text, re.M):
        counts[route] = int(float(value))
    return counts


def test_inventory_reads_pages_not_nodes(daemon: Daemon, viewer: str) -> None:
    """31 nodes, 10 a page: ``ansible-inventory --list`` costs the daemon 4 list requests
    and no per-node one, with the same groups and host vars as per-node reads give."""
    before = requests_served(daemon)
    result = run([str(BIN / "ansible-inventory"), "-i", str(SCRIPT), "--list"],
                 {"PROVISIONER_URL": daemon.url, "PROVISIONER_TOKEN": viewer,
                  "PROVISIONER_INVENTORY_PAGE": "10"})
    assert result.returncode == 0, result.stderr
    after = requests_served(daemon)
    served = {route: after[route] - before.get(route, 0) for route in after
              if route != "/metrics" and after[route] != before.get(route, 0)}
    assert served == {"/api/v1/nodes": 4}, served
    listed = json.loads(result.stdout)
    assert len(listed["_meta"]["hostvars"]) == 31
    # what the per-node detail calls (the fallback against an older daemon) read is the same
    sim = plain(listed["_meta"]["hostvars"]["sim-r02-n005"])
    detail = json.loads(cli(daemon, "node", "show", sim["provisioner_node_id"], "--json",
                            token=viewer))
    assert sim == load_script().hostvars(detail)
    assert sim["provisioner_gpu_count"] == 8


def test_list_stays_light_unless_facts_are_asked(daemon: Daemon, viewer: str) -> None:
    def page(query: str) -> Any:
        request = urllib.request.Request(f"{daemon.url}/api/v1/nodes?{query}",
                                         headers={"Authorization": f"Bearer {viewer}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    light = page("limit=5")
    assert light["items"] and all("facts" not in item for item in light["items"])
    full = page("limit=5&include=facts")
    assert [item["id"] for item in full["items"]] == [item["id"] for item in light["items"]]
    assert all(isinstance(item["facts"], dict) for item in full["items"])
    assert {key for item in full["items"] for key in item} - {"facts"} == {
        key for item in light["items"] for key in item}
    try:
        page("include=history")
    except urllib.error.HTTPError as exc:
        assert exc.code == 422
    else:
        raise AssertionError("include=history was accepted")


def test_inventory_finds_the_daemon_from_its_config(daemon: Daemon, viewer: str,
                                                    tmp_path: Path) -> None:
    """No URL given: the daemon's own config (``[api] listen``) names it, as for the CLI;
    the token from PROVISIONER_TOKEN_FILE."""
    token_file = tmp_path / "token"
    token_file.write_text(viewer + "\n")
    result = run([sys.executable, str(SCRIPT), "--list"],
                 {"PROVISIONER_CONFIG": str(daemon.config),
                  "PROVISIONER_TOKEN_FILE": str(token_file)})
    assert result.returncode == 0, result.stderr
    assert "gpu-real-01" in json.loads(result.stdout)["_meta"]["hostvars"]


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("provisioner_inventory", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_inventory_falls_back_to_node_reads_on_an_older_daemon(
        daemon: Daemon, viewer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon that does not know what ``include`` asks for answers 422 (an older one: for
    any ``include``); the script then lists without it and reads each node."""
    script = load_script()
    monkeypatch.setattr(script, "INCLUDE", "facts-of-a-newer-daemon")
    monkeypatch.setenv("PROVISIONER_INVENTORY_PAGE", "10")
    refused = requests_served(daemon, 422).get("/api/v1/nodes", 0)
    before = requests_served(daemon)
    nodes = script.fetch_nodes(daemon.url, viewer)
    after = requests_served(daemon)
    served = {route: after[route] - before.get(route, 0) for route in after
              if route != "/metrics" and after[route] != before.get(route, 0)}
    assert served == {"/api/v1/nodes": 4, "/api/v1/nodes/{id}": 31}, served
    assert len(nodes) == 31 and all(isinstance(node["facts"], dict) for node in nodes)
    assert requests_served(daemon, 422).get("/api/v1/nodes", 0) == refused + 1
