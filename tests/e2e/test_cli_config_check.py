"""``provisioner config check`` runs exactly what ``serve`` checks before it binds: the same
exit code and message for a config ``serve`` rejects, "ok" for one it starts with; and a
healthy start (the shipped demo config) logs no WARNING."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.daemon_proc import DaemonProcess
from tests.e2e.test_cli_api import clean_env

pytestmark = pytest.mark.e2e

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.toml"


def provisioner(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provisioner", *args], capture_output=True,
                          text=True, timeout=timeout, env=clean_env(), check=False)


def _demo_config(root: Path) -> Path:
    """The shipped demo config, with a state dir and an API port of this test's own."""
    from tests.peers.ports import free_tcp_port

    text = DEMO.read_text().replace("/tmp/provisioner-demo", str(root / "state"))
    text = re.sub(r'listen = "127\.0\.0\.1:\d+"', f'listen = "127.0.0.1:{free_tcp_port()}"',
                  text)
    path = root / "demo.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("extra", "message"), [
    ('[install]\nplaybooks_dir = "{root}/nowhere"\n',
     "install.playbooks_dir: {root}/nowhere lacks site.yml or join.yml"),
    ('[install]\nssh_private_key_file = "{root}/no-key"\n',
     "install.ssh_private_key_file: {root}/no-key does not exist"),
    ('[dhcp]\nmode = "proxy"\n',
     "http.listen: needed when dhcp.mode is not off (iPXE scripts)"),
    ('[kube]\nkubeconfig = "{root}/no-kubeconfig"\n',
     "kube.kubeconfig {root}/no-kubeconfig: no such file"),
])
def test_config_check_fails_as_serve_does(tmp_path: Path, extra: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[api]\nlisten = "127.0.0.1:1"\n'
                      + extra.format(root=tmp_path))
    expected = message.format(root=tmp_path)
    check = provisioner("--config", str(config), "config", "check")
    assert check.returncode == 2, check
    assert check.stdout == ""
    assert check.stderr.strip() == f"provisioner: config error: {expected}"
    serve = provisioner("--config", str(config), "serve", timeout=30)
    assert serve.returncode == 2, serve
    assert f"cannot start: {expected}" in serve.stdout + serve.stderr
    assert not (tmp_path / "state").exists()  # serve stopped before it wrote anything


def test_config_check_rejects_what_loading_rejects(tmp_path: Path) -> None:
    config = tmp_path / "typo.toml"
    config.write_text('[api]\nlisten = "127.0.0.1:1"\nnot_a_key = 3\n')
    check = provisioner("--config", str(config), "config", "check")
    serve = provisioner("--config", str(config), "serve", timeout=30)
    assert check.returncode == serve.returncode == 2
    assert check.stderr.strip().startswith("provisioner: config error:")
    assert check.stderr == serve.stderr


def test_demo_config_checks_ok_and_starts_without_a_warning(tmp_path: Path) -> None:
    config = _demo_config(tmp_path)
    check = provisioner("--config", str(config), "config", "check", "-v")
    assert check.returncode == 0, check
    assert check.stdout.splitlines()[-1] == "ok"
    assert any(line.startswith("checked playbooks: ") for line in check.stdout.splitlines())
    port = int(re.findall(r'listen = "127\.0\.0\.1:(\d+)"', config.read_text())[0])
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    daemon.start()
    try:
        daemon.wait_ready(port)
        deadline = time.monotonic() + 20
        while " ready: " not in daemon.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # the simulated rack's first transitions and the fleet's lead
    finally:
        assert daemon.stop() == 0
    text = daemon.log_path.read_text()
    assert " ready: " in text, text[-2000:]
    warnings = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
    assert warnings == [], warnings


def test_under_journald_a_node_line_names_it_with_fields(tmp_path: Path) -> None:
    """The daemon under systemd (``JOURNAL_STREAM``) writes to journald's native socket:
    each node's transition carries NODE (its hostname), NODE_ID, STATE and EVENT."""
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal.bind(str(tmp_path / "journal.sock"))
    journal.settimeout(30)
    config = _demo_config(tmp_path)
    env = dict(clean_env(), JOURNAL_STREAM="8:1234",
               PROVISIONER_JOURNAL_SOCKET=str(tmp_path / "journal.sock"))
    env.pop("PYTHONASYNCIODEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], env=env, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    records: list[dict[str, str]] = []
    try:
        while not (any(r.get("EVENT") == "inspect" for r in records)
                   and any(r["LOGGER"] == "provisioner.bmc.managed" for r in records)):
            records.append(_fields(journal.recv(1 << 20)))
    finally:
        proc.terminate()
        journal.settimeout(0.2)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):  # what it logs while it stops
                records.append(_fields(journal.recv(1 << 20)))
        proc.kill()
        proc.wait(5)
        journal.close()
    assert proc.stderr is not None and proc.stderr.read() == b""  # all went to the journal
    ready = next(r for r in records if r["MESSAGE"].startswith("ready: "))
    assert ready["PRIORITY"] == "6" and ready["LOGGER"] == "provisioner.daemon"
    inspect = next(r for r in records if r.get("EVENT") == "inspect")
    host, node_id = inspect["NODE"], inspect["NODE_ID"]
    assert host != node_id and inspect["STATE"] == "inspecting"
    assert inspect["MESSAGE"].startswith(f"node {host} ({node_id}): enrolled --inspect--> "
                                         "inspecting by policy")
    bmc = next(r for r in records if r["LOGGER"] == "provisioner.bmc.managed")
    assert bmc["NODE"] != bmc["NODE_ID"]  # another module's line: named by hostname too
    assert bmc["MESSAGE"].startswith(f"node {bmc['NODE']} ({bmc['NODE_ID']}): bmc fake:")
    assert all(int(r["PRIORITY"]) > 4 for r in records), records  # no WARNING


def _fields(datagram: bytes) -> dict[str, str]:
    """journald's native protocol read back (``KEY=value`` lines; no binary form here)."""
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def test_config_show_says_when_serve_would_not_start(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[install]\n'
                      f'playbooks_dir = "{tmp_path}/nowhere"\n')
    show = provisioner("--config", str(config), "config", "show")
    assert show.returncode == 0 and "[install]" in show.stdout
    assert show.stderr.strip() == ("provisioner: warning: serve would not start: "
                                   f"install.playbooks_dir: {tmp_path}/nowhere lacks site.yml "
                                   "or join.yml")
