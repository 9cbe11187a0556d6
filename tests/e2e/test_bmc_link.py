"""Zero-touch BMC linking against a real daemon and a real BMC (OpenIPMI ``ipmi_sim`` at
127.0.0.23:623, the standard port on its own loopback address): an unknown machine
PXE-boots, its inspection report names its BMC, and the daemon links the node to that BMC
with the site default credentials, then powers the node off through it. Nobody enrolled the
BMC."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_api import as_json, new_token, run_cli, running_daemon
from tests.integration.test_boot_http import host_facts
from tests.peers.ipmi_sim import (
    PASSWORD,
    USER,
    ipmi_sim_unavailable_reason,
    running_ipmi_sim,
)
from tests.peers.ports import free_tcp_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
MAC = "52:54:00:77:00:61"
BMC_ADDRESS = "127.0.0.23"
BMC_MAC = "52:54:00:77:0b:61"


def http(url: str, body: object | None = None, token: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


@pytest.mark.parametrize("allowed", ["127.0.0.0/8", "10.250.0.0/16"],
                         ids=["in-link-subnets", "outside-held"])
def test_the_inspection_report_links_the_node_to_its_bmc(tmp_path: Path, allowed: str) -> None:
    """Security (issue 23, finding 8): a report is unauthenticated, so a BMC address outside
    ``bmc.link_subnets`` is held for an operator and never gets the site credentials."""
    if (reason := ipmi_sim_unavailable_reason()) is not None:
        pytest.skip(reason)
    boot_port = free_tcp_port()
    password = tmp_path / "default-password"
    settings = ("[lifecycle]\nauto_deploy = false\n\n"
                f'[http]\nlisten = "127.0.0.1:{boot_port}"\n\n'
                f'[bmc]\nlink_subnets = ["{allowed}"]\n'
                f'default_username = "{USER}"\ndefault_password = "{PASSWORD}"\n'
                "timeout_s = 5\nconfirm_poll_s = 0.2\npower_sync_interval_s = 0\n")
    password.write_text(PASSWORD)
    with running_ipmi_sim(tmp_path / "bmc", address=BMC_ADDRESS, port=623) as bmc, \
            running_daemon(tmp_path / "daemon", settings) as daemon:
        subprocess.run(["ipmitool", "-I", "lanplus", "-C", "3", "-H", BMC_ADDRESS, "-U", USER,
                        "-f", str(password), "chassis", "power", "on"], check=True,
                       capture_output=True, timeout=30)
        assert bmc.power() == "on"
        boot = f"http://127.0.0.1:{boot_port}"
        script = http(f"{boot}/boot/{MAC}.ipxe")  # an unknown MAC: discovered, inspected
        token = next(word.partition("=")[2] for word in script.split()
                     if word.startswith("provisioner.token="))
        facts = host_facts(MAC, "LINK-0001") | {"bmc": {"ip": BMC_ADDRESS, "mac": BMC_MAC}}
        admin = new_token(daemon, "admin", "link-e2e")

        def cli(*args: str) -> Any:
            result = run_cli(daemon, *args, token=admin)
            assert result.returncode == 0, result.stderr
            return as_json(result)

        deadline = time.monotonic() + 30
        while cli("node", "show", MAC, "--json")["state"] != "inspecting":  # auto_inspect
            assert time.monotonic() < deadline
            time.sleep(0.2)
        http(f"{boot}/agent/v1/facts", {"mac": MAC, "facts": facts}, token)
        deadline = time.monotonic() + 60
        while (shown := cli("node", "show", MAC, "--json"))["state"] != "inspected":
            assert time.monotonic() < deadline and not shown["state"].endswith("_failed"), shown
            time.sleep(0.5)
        if allowed != "127.0.0.0/8":
            assert shown["bmc"] is None
            assert any("held for an operator" in h["reason"] for h in shown["history"])
            assert bmc.power() == "on"  # never reached with the site credentials
            return
        assert shown["bmc"] == {"driver": "ipmi", "address": BMC_ADDRESS, "port": None,
                                "username": None, "password_set": False}
        assert PASSWORD not in json.dumps(shown)
        linked = [h for h in shown["history"] if h["event"] == "bmc_linked"]
        assert [h["reason"] for h in linked] == [
            f"BMC {BMC_ADDRESS} (ipmi) linked from the inspection report; site default "
            "credentials"]
        assert bmc.power() == "off"  # the inspect step powered it off through that BMC
