"""A database the daemon cannot reach is a one-line configuration error that names the key
and never shows the URL's password (not a traceback): real PostgreSQL client, a refused port
on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.config import Settings
from provisioner.errors import ConfigError
from provisioner.store.store import open_store
from tests.peers.ports import free_tcp_port

PASSWORD = "db-Pa55-unreach-77"  # noqa: S105 (a planted test value)


def url() -> str:
    return f"postgresql+psycopg://prov:{PASSWORD}@127.0.0.1:{free_tcp_port()}/p"


def test_open_store_says_why_in_one_line(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, database_url=url())  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        open_store(settings)
    message = str(caught.value)
    assert message.startswith("database_url: cannot use the database: ")
    assert "\n" not in message and PASSWORD not in message


def test_serve_exits_with_that_line(tmp_path: Path) -> None:
    config = tmp_path / "provisioner.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\ndatabase_url = "{url()}"\n'
                      f'[api]\nlisten = "127.0.0.1:{free_tcp_port()}"\n[log]\nlevel = "DEBUG"\n')
    result = subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], capture_output=True, text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in output and PASSWORD not in output
    assert "database_url: cannot use the database" in output
