"""``provisioner config check`` runs exactly what ``serve`` checks before it binds: the same
exit code and message for a config ``serve`` rejects, "ok" for one it starts with; and a
healthy start (the shipped demo config) logs no WARNING."""

from __future__ import annotations

import re
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
