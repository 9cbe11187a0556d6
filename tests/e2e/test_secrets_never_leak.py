"""Secrets never leak (docs/security.md): the daemon runs with DEBUG logging, known values of
every secret are planted (BMC password, API token, agent token, the Fernet key, the site's BMC
default password, the slurmrestd JWT, a database password), the API, boot HTTP and CLI are
driven through their success and error paths, and then each place a secret could surface is
searched for each of them: the daemon's log, every API and agent response, the history rows,
error messages, the files left in the state dir (Ansible run directories included; the key
file itself and the database, which holds only hashes and ciphertext, are searched too, for
the plaintext), ``config show`` and the Prometheus exposition."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_api import Daemon, clean_env, new_token, running_daemon
from tests.peers.ports import free_tcp_port

pytestmark = pytest.mark.e2e

BMC_PASSWORD = "bmc-Pa55-7f3c1e"  # noqa: S105 (a planted test value)
DEFAULT_BMC_PASSWORD = "site-default-Pa55-19ab"  # noqa: S105
JWT = "eyJhbGciOiJIUzI1NiJ9.planted-jwt-4e5d.sig"  # noqa: S105
DB_PASSWORD = "db-Pa55-88c2"  # noqa: S105
MAC = "52:54:00:5e:c0:01"


class Recorder:
    """Every response body the test saw, to be searched at the end."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def call_no_500(self, url: str, *, token: str | None = None, method: str = "GET",
             body: object = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
        assert status != 500, text  # 502: a BMC that refuses, mapped; never an internal error
        self.seen.append(text)
        return status, text


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str]]:
    http = f"127.0.0.1:{free_tcp_port()}"
    settings = (
        '[log]\nlevel = "DEBUG"\n\n'
        "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n\n"
        "[simulation]\nstep_delay_s = 0.01\n\n"
        f'[http]\nlisten = "{http}"\n\n'
        '[boot]\nramdisk_build = "off"\n\n'
        f'[bmc]\ndefault_username = "admin"\ndefault_password = "{DEFAULT_BMC_PASSWORD}"\n\n'
        f'[slurm]\njwt_token = "{JWT}"\n')
    with running_daemon(tmp_path_factory.mktemp("e2e-secrets"), settings) as running:
        yield running, f"http://{http}"


def test_no_secret_in_logs_responses_history_files_config_or_metrics(
        daemon: tuple[Daemon, str]) -> None:
    running, boot_url = daemon
    rec = Recorder()
    admin = new_token(running, "admin", "leak-admin")
    viewer = new_token(running, "viewer", "leak-viewer")
    api = f"{running.url}/api/v1"

    # a node with a BMC password; one whose BMC refuses (an error path with the password)
    status, text = rec.call_no_500(f"{api}/nodes", token=admin, method="POST", body={
        "hostname": "leak-01", "serial": "LEAK01", "macs": [MAC],
        "bmc": {"driver": "fake", "address": "SIMLEAK", "username": "admin",
                "password": BMC_PASSWORD}})
    assert status == 201, text
    node = json.loads(text)
    status, text = rec.call_no_500(f"{api}/nodes", token=admin, method="POST", body={
        "hostname": "leak-02", "bmc": {"driver": "redfish", "address": "127.0.0.1",
                                       "port": free_tcp_port(), "username": "root",
                                       "password": BMC_PASSWORD}})
    assert status == 201, text
    refusing = json.loads(text)
    rec.call_no_500(f"{api}/nodes/{refusing['id']}/power", token=admin, method="POST",
             body={"action": "status"})
    rec.call_no_500(f"{api}/nodes/{node['id']}/actions/inspect", token=admin, method="POST")
    rec.call_no_500(f"{api}/nodes/{node['id']}/actions/bogus", token=admin, method="POST")
    rec.call_no_500(f"{api}/nodes", token=admin + "x")  # a wrong token is not echoed back
    rec.call_no_500(f"{api}/nodes", token=viewer, method="POST", body={"hostname": "x"})  # 403

    # the boot HTTP server: the script carries the node's agent token (by design) ...
    status, script = rec.call_no_500(f"{boot_url}/boot/52:54:00:5e:c0:99.ipxe")
    assert status == 200 and "provisioner.token=pvt_" in script
    agent_token = script.split("provisioner.token=", 1)[1].split()[0]
    rec.seen.remove(script)  # the one place it must appear
    # ... and the agent calls, good and bad, never echo it
    rec.call_no_500(f"{boot_url}/agent/v1/command", token=agent_token)
    rec.call_no_500(f"{boot_url}/agent/v1/facts", token=agent_token, method="POST",
             body={"mac": "52:54:00:5e:c0:99", "facts": {"bogus": agent_token}})
    rec.call_no_500(f"{boot_url}/agent/v1/command", token=agent_token + "x")
    rec.call_no_500(f"{boot_url}/agent/v1/callback", token=agent_token, method="POST",
             body={"event": agent_token, "hostname": "h"})

    for target in (node, refusing):
        rec.call_no_500(f"{api}/nodes/{target['id']}", token=admin)
        rec.call_no_500(f"{api}/nodes/{target['id']}/history", token=admin)
    rec.call_no_500(f"{api}/nodes?limit=100", token=admin)
    status, metrics = rec.call_no_500(f"{running.url}/metrics")
    assert status == 200 and "provisioner_" in metrics

    # config show, with every secret setting set (a config file of its own)
    shown = running.root / "show.toml"
    shown.write_text(
        f'state_dir = "{running.root / "state"}"\n'
        f'database_url = "postgresql+psycopg://prov:{DB_PASSWORD}@db:5432/p"\n'
        f'[bmc]\ndefault_password = "{DEFAULT_BMC_PASSWORD}"\n'
        f'[slurm]\njwt_token = "{JWT}"\n')
    for extra in ([], ["--json"]):
        result = subprocess.run(
            [sys.executable, "-m", "provisioner", "--config", str(shown), "config", "show",
             *extra], capture_output=True, text=True, timeout=60, env=clean_env(), check=False)
        assert result.returncode == 0, result.stderr
        rec.seen.append(result.stdout + result.stderr)
    assert "***" in rec.seen[-1]

    fernet_key = (running.root / "state" / "secret.key").read_text().strip()
    secrets = {"BMC password": BMC_PASSWORD, "site BMC password": DEFAULT_BMC_PASSWORD,
               "slurmrestd JWT": JWT, "database password": DB_PASSWORD,
               "admin API token": admin, "viewer API token": viewer,
               "agent token": agent_token, "Fernet key": fernet_key}

    log_text = running.log.read_text(errors="replace")
    assert " DEBUG " in log_text  # the log really is at DEBUG
    assert_absent(secrets, "the daemon's log", log_text)
    assert_absent(secrets, "API and agent responses", "\n".join(rec.seen))
    assert_absent(secrets, "the metrics", metrics)
    files = state_files(running.root / "state")
    assert files, "nothing in the state dir"
    for path, data in files.items():
        planted = {name: value for name, value in secrets.items()
                   if not (name == "Fernet key" and path.name == "secret.key")}
        assert_absent(planted, str(path), data.decode("latin-1"))


def assert_absent(secrets: dict[str, str], where: str, text: str) -> None:
    """No secret's value (nor its JSON-escaped form) occurs in ``text``."""
    found = [name for name, value in secrets.items()
             if value in text or json.dumps(value)[1:-1] in text]
    assert not found, f"{', '.join(found)} found in {where}"


def state_files(root: Path) -> dict[Path, bytes]:
    """Every regular file under the state dir (the database, WAL, run dirs, caches)."""
    files: dict[Path, Any] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 256 << 20:
            files[path] = path.read_bytes()
    return files
