"""The store's files and the configuration, against the real daemon and the real CLI (issue
23, "Low"): the SQLite single-daemon lock is the database file's, whatever the URL says; a
missing ``secret.key`` with secrets stored refuses the start; the state dir is 0700 and the
database 0600 under a 022 umask; ``config show`` masks ``?password=``; a config file that is
not UTF-8 is a one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from provisioner.store.secretbox import SecretBox
from tests.e2e.test_cli_api import clean_env, running_daemon
from tests.peers.ports import free_tcp_port, stop_process

pytestmark = pytest.mark.e2e

QUIET = "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n"


def serve(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "provisioner", "--config", str(config), "serve"],
            stdout=out, stderr=subprocess.STDOUT, env=clean_env(),
            preexec_fn=lambda: os.umask(0o022))


def exit_of(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        pytest.fail(f"the daemon kept running: {log.read_text()[-2000:]}")


def config_for(root: Path, state: Path, extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "provisioner.toml"
    config.write_text(f'{extra}state_dir = "{state}"\n[api]\n'
                      f'listen = "127.0.0.1:{free_tcp_port()}"\n{QUIET}')
    return config


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=60, env=clean_env(),
                          check=False)


def test_one_sqlite_file_is_one_daemon_whatever_its_url_says(tmp_path: Path) -> None:
    with running_daemon(tmp_path / "first", QUIET) as first:
        database = first.root / "state" / "provisioner.sqlite"
        link = tmp_path / "link.sqlite"
        link.symlink_to(database)
        for n, url in enumerate((f"sqlite:///{database}?timeout=30",
                                 f"sqlite:///{tmp_path}/second/../first/state/provisioner.sqlite",
                                 f"sqlite:///{link}")):
            config = config_for(tmp_path / f"second{n}", tmp_path / f"state{n}",
                                f'database_url = "{url}"\n')
            log = tmp_path / f"second{n}.log"
            code = exit_of(serve(config, log), log)
            assert code == 2, (url, log.read_text()[-2000:])
            assert "another provisioner daemon" in log.read_text(), url
        assert urllib.request.urlopen(f"{first.url}/healthz", timeout=5).status == 200


def test_a_lost_secret_key_is_refused_not_replaced(tmp_path: Path) -> None:
    state = tmp_path / "d" / "state"
    with running_daemon(tmp_path / "d", QUIET) as daemon:
        token = cli(daemon.config, "token", "create", "--role", "admin", "--name", "a")
        body = json.dumps({"serial": "KEY-1", "bmc": {"driver": "fake", "address": "SIMKEY",
                                                      "username": "root",
                                                      "password": "pw-0x43"}}).encode()
        request = urllib.request.Request(
            f"{daemon.url}/api/v1/nodes", data=body, method="POST",
            headers={"Authorization": f"Bearer {token.stdout.split()[-1]}",
                     "Content-Type": "application/json"})
        assert urllib.request.urlopen(request, timeout=10).status == 201
    key = state / "secret.key"
    original = key.read_bytes()
    key.unlink()
    log = tmp_path / "restart.log"
    code = exit_of(serve(daemon.config, log), log)
    text = log.read_text()
    assert code == 2 and "secret.key is missing" in text and "Traceback" not in text, text
    assert not key.exists()  # no new key that could never decrypt the stored password
    key.write_bytes(original)
    key.chmod(0o600)
    proc = serve(daemon.config, log)
    try:
        deadline = time.monotonic() + 30
        while "ready" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        assert "ready" in log.read_text()
    finally:
        stop_process(proc)


def test_a_daemon_with_a_key_of_its_own_is_refused(tmp_path: Path) -> None:
    """Issue 29: a second daemon on the fleet's database with a state dir of its own (its
    own ``secret.key``, not copied) exits 2 naming the key to copy, before it serves."""
    with running_daemon(tmp_path / "a", QUIET):
        pass  # the fleet's first start: key, database, key check
    database = tmp_path / "a" / "state" / "provisioner.sqlite"
    own = tmp_path / "b" / "state"
    own.mkdir(parents=True, mode=0o700)
    (own / "secret.key").write_bytes(SecretBox.new_key())
    (own / "secret.key").chmod(0o600)
    config = config_for(tmp_path / "b", own, f'database_url = "sqlite:///{database}"\n')
    log = tmp_path / "b.log"
    code = exit_of(serve(config, log), log)
    text = log.read_text()
    fleet = SecretBox((tmp_path / "a" / "state" / "secret.key").read_bytes()).fingerprint
    assert code == 2 and "does not open this fleet's secrets" in text, text
    assert fleet in text and "Traceback" not in text, text


def test_a_fresh_state_dir_is_private_under_a_022_umask(tmp_path: Path) -> None:
    state = tmp_path / "fresh" / "state"
    config = config_for(tmp_path / "fresh", state)
    log = tmp_path / "fresh.log"
    proc = serve(config, log)
    try:
        deadline = time.monotonic() + 30
        # the key file is written after the migrations, which made the WAL
        while not ((state / "provisioner.sqlite-wal").exists()
                   and (state / "secret.key").exists()) and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        modes = {path.name: path.stat().st_mode & 0o777
                 for path in (state, state / "provisioner.sqlite",
                              state / "provisioner.sqlite-wal", state / "secret.key")}
    finally:
        stop_process(proc)
    assert modes == {"state": 0o700, "provisioner.sqlite": 0o600,
                     "provisioner.sqlite-wal": 0o600, "secret.key": 0o600}, modes


def test_config_show_masks_a_password_in_the_url_query(tmp_path: Path) -> None:
    config = config_for(tmp_path, tmp_path / "state",
                        'database_url = "postgresql+psycopg://prov@db:5432/p?sslmode=require'
                        '&password=Query-pw-0x44"\n')
    for extra in ((), ("--json",)):
        done = cli(config, "config", "show", *extra)
        assert done.returncode == 0, done.stderr
        assert "Query-pw-0x44" not in done.stdout + done.stderr
        assert "password=***" in done.stdout and "sslmode=require" in done.stdout


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "latin1.toml"
    config.write_bytes('state_dir = "/tmp/caf\u00e9"\n'.encode("latin-1"))
    for args in (("config", "show"), ("serve",)):
        done = cli(config, *args)
        assert done.returncode == 2, done
        assert "not UTF-8" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().count("\n") == 0, done.stderr
