"""Local CLI commands as real subprocesses against a temporary state dir (no daemon)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provisioner", *args], capture_output=True,
                          text=True, timeout=60, env=env or clean_env(), check=False)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "provisioner.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n\n[api]\nlisten = "0.0.0.0:8799"\n')
    return path


def test_db_upgrade_then_again(config: Path, tmp_path: Path) -> None:
    first = run_cli("--config", str(config), "db", "upgrade")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("database schema upgraded from empty to ")
    assert (tmp_path / "state" / "provisioner.sqlite").exists()

    again = run_cli("--config", str(config), "db", "upgrade")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("database schema already at ")


def test_token_create_prints_token_last(config: Path) -> None:
    result = run_cli("--config", str(config), "token", "create", "--role", "admin",
                     "--name", "ops")
    assert result.returncode == 0, result.stderr
    token = result.stdout.splitlines()[-1]
    assert token.startswith("pvt_")
    assert len(token) > 20
    assert token not in result.stderr
    assert "admin token 'ops'" in result.stderr

    other = run_cli("--config", str(config), "token", "create", "--role", "viewer",
                    "--name", "dashboards")
    assert other.returncode == 0, other.stderr
    assert other.stdout.splitlines()[-1] != token


def test_token_create_duplicate_name_is_one_line_error(config: Path) -> None:
    assert run_cli("--config", str(config), "token", "create", "--role", "viewer",
                   "--name", "twice").returncode == 0
    result = run_cli("--config", str(config), "token", "create", "--role", "viewer",
                     "--name", "twice")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "provisioner: error: a token named 'twice' already exists\n"


def test_token_create_with_unusable_state_dir_is_one_line_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    config = tmp_path / "c.toml"
    config.write_text(f'state_dir = "{not_a_dir / "state"}"\n')
    result = run_cli("--config", str(config), "token", "create", "--role", "admin", "--name", "x")
    assert result.returncode == 1
    assert result.stderr == f"provisioner: error: {not_a_dir / 'state'}: Not a directory\n"


def test_config_show(config: Path, tmp_path: Path) -> None:
    env = clean_env() | {"PROVISIONER_LIFECYCLE__AUTO_DEPLOY": "false",
                         "PROVISIONER_DATABASE_URL": "postgresql://prov:pw123@db/prov"}
    result = run_cli("--config", str(config), "config", "show", env=env)
    assert result.returncode == 0, result.stderr
    assert "pw123" not in result.stdout
    shown = tomllib.loads(result.stdout)  # the output is valid TOML
    assert shown["state_dir"] == str(tmp_path / "state")
    assert shown["database_url"] == "postgresql://prov:***@db/prov"
    assert shown["api"]["listen"] == "0.0.0.0:8799"
    assert shown["lifecycle"]["auto_deploy"] is False  # the environment overrides the file

    as_json = run_cli("--config", str(config), "config", "show", "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    assert _without_unset(json.loads(as_json.stdout)) == shown  # TOML has no null


def _without_unset(data: dict[str, object]) -> dict[str, object]:
    return {key: _without_unset(value) if isinstance(value, dict) else value  # type: ignore[arg-type]
            for key, value in data.items() if value is not None}


def test_config_error_from_environment_names_the_variable(config: Path) -> None:
    env = clean_env() | {"PROVISIONER_API__LISTEN": "nonsense"}
    result = run_cli("--config", str(config), "config", "show", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("provisioner: config error: invalid config")
    assert "api.listen (or PROVISIONER_API__LISTEN)" in result.stderr


def test_api_command_without_a_daemon_is_one_line_error(config: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = clean_env() | {"PROVISIONER_URL": f"http://127.0.0.1:{port}"}
    result = run_cli("node", "list", env=env)
    assert result.returncode == 1
    assert result.stderr == (f"provisioner: error: cannot reach provisioner at "
                             f"http://127.0.0.1:{port}: connection refused\n")


def test_serve_with_bad_config_exits_2_before_starting(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[store]\npool_size = 0\n")
    result = run_cli("--config", str(config), "serve")
    assert result.returncode == 2
    assert "store.pool_size" in result.stderr


def test_ramdisk_build_x86_64_into_the_state_dir_then_cached(tmp_path: Path) -> None:
    """``provisioner ramdisk build`` from the host's own kernel, busybox and python3 (setup.sh
    installs them): both files under the state dir's artefacts, a gzip'd newc cpio holding
    the agent; a second run is a cache hit that rewrites nothing."""
    state = tmp_path / "state"
    first = run_cli("ramdisk", "build", "--arch", "x86_64", "--state-dir", str(state))
    assert first.returncode == 0, first.stderr
    kernel, initrd = (Path(line) for line in first.stdout.split())
    assert kernel == state / "artefacts" / "inspect" / "vmlinuz"
    assert initrd == state / "artefacts" / "inspect" / "initrd.gz"
    assert kernel.read_bytes()[:2] == b"MZ" and initrd.read_bytes()[:2] == b"\x1f\x8b"
    listing = subprocess.run(f"zcat {initrd} | cpio -it --quiet", shell=True, text=True,
                             capture_output=True, check=True).stdout.split()
    assert "init" in listing and "bin/busybox" in listing
    assert "opt/agent/provisioner/agent/collect.py" in listing  # the agent, as shipped
    # every module the agent needs at run time is in it, codecs too (found by running them)
    root = tmp_path / "unpacked"
    root.mkdir()
    subprocess.run(f"zcat {initrd} | cpio -idm --quiet", shell=True, cwd=root, check=True)
    probe = subprocess.run(
        ["chroot", str(root), "/usr/bin/python3", "-S", "-c",
         "import sys; sys.path.insert(0, '/opt/agent'); "
         "import provisioner.agent.__main__, provisioner.agent.deploy, "
         "provisioner.agent.partition, provisioner.agent.qcow2, provisioner.agent.collect; "
         "print('cidata'.encode('utf-16-le').hex(), 'x'.encode('idna'))"],
        capture_output=True, text=True, check=False)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split()[0] == "630069006400610074006100"
    stamp = initrd.stat().st_mtime_ns
    again = run_cli("ramdisk", "build", "--arch", "x86_64", "--state-dir", str(state))
    assert again.returncode == 0, again.stderr
    assert initrd.stat().st_mtime_ns == stamp


def test_ramdisk_build_refuses_an_unknown_architecture(tmp_path: Path) -> None:
    result = run_cli("ramdisk", "build", "--arch", "riscv64", "--state-dir", str(tmp_path))
    assert result.returncode == 2
    assert "invalid choice: 'riscv64'" in result.stderr
