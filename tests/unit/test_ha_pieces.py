"""Small pieces of the several-daemons support: the NOTIFY payload, the SQLite lock file."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import ConfigError
from provisioner.store.exclusive import lock_sqlite, sqlite_path
from provisioner.store.notify import NodeChanged, parse


def test_notify_payload_round_trip_and_garbage() -> None:
    assert parse("mgmt-a|n1|52:54:00:00:00:01,52:54:00:00:00:02") == NodeChanged(
        "mgmt-a", "n1", ("52:54:00:00:00:01", "52:54:00:00:00:02"))
    assert parse("mgmt-a|n1|") == NodeChanged("mgmt-a", "n1", ())
    for bad in ("", "x", "a|b", "a||m", "a|b|c|d"):
        assert parse(bad) is None


def test_sqlite_path_of_urls(tmp_path: Path) -> None:
    assert sqlite_path(f"sqlite:///{tmp_path}/p.sqlite") == tmp_path / "p.sqlite"
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("postgresql+psycopg://u@h/db") is None


def test_second_lock_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/p.sqlite"
    first = lock_sqlite(url)
    assert first is not None
    with pytest.raises(ConfigError, match=r"already serves the SQLite database .*p\.sqlite"):
        lock_sqlite(url)  # flock: a second open file description conflicts, same process too
    first.release()
    again = lock_sqlite(url)  # released: free again
    assert again is not None
    again.release()
    assert lock_sqlite("postgresql+psycopg://u@h/db") is None
