"""``--config`` before or after the command (issue 30, item 10), through the real CLI as a
subprocess: ``provisioner serve --config F`` starts on F's port, ``provisioner token create
--config F`` and ``provisioner node list --config F`` reach that daemon through F, and
``config check`` says the same wherever the option stands (the later one wins)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cli_api import clean_env, wait_healthy
from tests.peers.ports import free_tcp_port, stop_process

pytestmark = pytest.mark.e2e


def provisioner(*args: str, env: dict[str, str] | None = None,
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provisioner", *args], capture_output=True,
                          text=True, timeout=60, env=env or clean_env(), check=False)


def _config(root: Path, port: int, extra: str = "") -> Path:
    path = root / "provisioner.toml"
    path.write_text(f'state_dir = "{root / "state"}"\n\n[api]\nlisten = "127.0.0.1:{port}"\n\n'
                    "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n" + extra)
    return path


def test_config_check_reads_config_before_or_after_the_command(tmp_path: Path) -> None:
    good = _config(tmp_path, free_tcp_port())
    bad = tmp_path / "bad.toml"
    bad.write_text('[api]\nlisten = "127.0.0.1:1"\nnot_a_key = 3\n')
    before = provisioner("--config", str(bad), "config", "check")
    after = provisioner("config", "check", "--config", str(bad))
    assert before.returncode == after.returncode == 2
    assert after.stderr == before.stderr and "not_a_key" in after.stderr
    assert provisioner("config", "--config", str(bad), "check").stderr == before.stderr

    ok = provisioner("config", "check", "--config", str(good))
    assert (ok.returncode, ok.stdout.splitlines()[-1]) == (0, "ok"), ok.stderr
    later_wins = provisioner("--config", str(bad), "config", "check", "--config", str(good))
    assert later_wins.returncode == 0, later_wins.stderr
    missing = provisioner("config", "show", "--config", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "none.toml" in missing.stderr


def test_serve_token_and_node_list_with_config_after_the_command(tmp_path: Path) -> None:
    port = free_tcp_port()
    config = _config(tmp_path, port)
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "provisioner", "serve",
                                 "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, env=clean_env())
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        created = provisioner("token", "create", "--role", "admin", "--name", "after",
                              "--config", str(config))
        assert created.returncode == 0, created.stderr
        env = clean_env() | {"PROVISIONER_TOKEN": created.stdout.splitlines()[-1]}
        enrolled = provisioner("node", "enroll", "--serial", "GO-1", "--mac",
                               "52:54:00:60:00:01", "--hostname", "go-1",
                               "--config", str(config), env=env)
        assert enrolled.returncode == 0, enrolled.stderr
        listed = provisioner("node", "list", "--config", str(config), "--columns", "hostname",
                             env=env)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split() == ["HOSTNAME", "go-1"]
        # the daemon is found through the config: with another config, another (no) daemon
        (tmp_path / "other").mkdir()
        other = _config(tmp_path / "other", free_tcp_port())
        elsewhere = provisioner("node", "list", "--config", str(other), env=env)
        assert elsewhere.returncode == 1 and "cannot reach provisioner" in elsewhere.stderr
    finally:
        stop_process(proc)
