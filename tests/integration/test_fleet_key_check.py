"""Every daemon of a fleet holds the same secret key, or does not start (issue 29): the
first start records a key check in the database; a daemon with another ``secret.key``, or
with none, on that database refuses with the fingerprint of the key to copy; a database with
BMC passwords from before the check is checked against one of them. On SQLite and on the
real PostgreSQL (two daemons' state dirs, one database), and with two first starts racing."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlmodel import Session, delete

from provisioner.config import Settings
from provisioner.domain import BmcEndpoint, NewNode
from provisioner.errors import ConfigError
from provisioner.lifecycle.states import NodeState
from provisioner.store.models import SecretKeyCheckRow
from provisioner.store.secretbox import SecretBox
from provisioner.store.store import Store, open_store


def other_daemon(settings: Settings, tmp_path: Path, name: str) -> Settings:
    """The same database, seen from another daemon's state dir."""
    return settings.model_copy(update={"state_dir": tmp_path / name,
                                       "database_url": SecretStr(settings.sqlalchemy_url)})


async def enroll_with_password(store: Store) -> None:
    await store.nodes.create(NewNode(
        state=NodeState.ENROLLED, serial="KEY-1", bmc_password="pw-0x43",
        bmc=BmcEndpoint("fake", "SIMKEY", username="root", password_set=True)), actor="test")


def fingerprint(state_dir: Path) -> str:
    return SecretBox((state_dir / "secret.key").read_bytes().strip()).fingerprint


async def test_a_daemon_with_another_key_or_none_refuses(backend_settings: Settings,
                                                         tmp_path: Path) -> None:
    first = open_store(backend_settings, instance="daemon-a")
    await enroll_with_password(first)
    first.close()
    second = other_daemon(backend_settings, tmp_path, "b")
    with pytest.raises(ConfigError, match="secret.key is missing but the database holds"):
        open_store(second)  # no key of its own: never a new one in its place
    assert not (second.state_dir / "secret.key").exists()
    (second.state_dir / "secret.key").write_bytes(SecretBox.new_key())
    (second.state_dir / "secret.key").chmod(0o600)
    with pytest.raises(ConfigError) as refused:
        open_store(second)
    text = str(refused.value)
    assert fingerprint(backend_settings.state_dir) in text and "daemon-a" in text
    assert fingerprint(second.state_dir) in text and "copy secret.key" in text
    shutil.copy(backend_settings.state_dir / "secret.key", second.state_dir / "secret.key")
    store = open_store(second)  # the fleet's key: it starts and reads the password
    node = (await store.nodes.bmc_targets())[0]
    assert node.credentials.password == "pw-0x43"
    assert (await store.nodes.credentials(node.id)).password == "pw-0x43"
    store.close()


async def test_secrets_from_before_the_check_are_checked(backend_settings: Settings,
                                                        tmp_path: Path) -> None:
    first = open_store(backend_settings, instance="daemon-a")
    await enroll_with_password(first)
    with Session(first.engine) as session:  # a database written before migration 0012
        session.exec(delete(SecretKeyCheckRow))  # type: ignore[call-overload]
        session.commit()
    first.close()
    second = other_daemon(backend_settings, tmp_path, "b")
    second.state_dir.mkdir(mode=0o700)
    (second.state_dir / "secret.key").write_bytes(SecretBox.new_key())
    (second.state_dir / "secret.key").chmod(0o600)
    with pytest.raises(ConfigError, match="BMC passwords stored in the database were "
                                          "encrypted with another key"):
        open_store(second)
    again = open_store(backend_settings)  # the right key: the check is recorded now
    again.close()
    with pytest.raises(ConfigError, match=fingerprint(backend_settings.state_dir)):
        open_store(second)


def test_two_first_starts_with_two_keys_one_wins(backend_settings: Settings,
                                                 tmp_path: Path) -> None:
    """Two daemons started at once on an empty database, each with a key of its own: one
    records its key, the other is refused (never two keys in one fleet)."""
    first = open_store(backend_settings)  # migrate and create daemon a's key ...
    with Session(first.engine) as session:  # ... but leave the check to the race
        session.exec(delete(SecretKeyCheckRow))  # type: ignore[call-overload]
        session.commit()
    first.engine.dispose()
    settings = [backend_settings, other_daemon(backend_settings, tmp_path, "b")]
    settings[1].state_dir.mkdir(mode=0o700)
    (settings[1].state_dir / "secret.key").write_bytes(SecretBox.new_key())
    (settings[1].state_dir / "secret.key").chmod(0o600)
    outcomes: list[str] = []
    gate = threading.Barrier(2)

    def start(each: Settings) -> None:
        gate.wait()
        try:
            open_store(each, migrate=False).engine.dispose()  # alembic is one per process
            outcomes.append("started")
        except Exception as exc:  # noqa: BLE001  (the assertion names it)
            outcomes.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=start, args=(each,)) for each in settings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes)[-1] == "started", outcomes
    assert "does not open this fleet's secrets" in sorted(outcomes)[0], outcomes


def _load_together(path: Path, count: int) -> tuple[list[str], list[BaseException]]:
    """``count`` threads load (or create) the key at ``path`` at the same instant."""
    start = threading.Barrier(count)
    found: list[str] = []
    errors: list[BaseException] = []

    def load() -> None:
        start.wait()
        try:
            found.append(SecretBox.from_key_file(path).fingerprint)
        except BaseException as exc:  # noqa: BLE001 (collected: the test reports it)
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found, errors


def test_daemons_sharing_a_state_dir_create_one_key_together(tmp_path: Path) -> None:
    """Daemons started together on one state dir (the HA wave test, the HA bench) each
    create the key if it is missing: all load the same key and none fails (with one fixed
    temporary name, one unlinked the file another was about to link: ENOENT at start)."""
    for round_ in range(20):
        path = tmp_path / f"round-{round_}" / "secret.key"
        found, errors = _load_together(path, 6)
        assert errors == [] and len(found) == 6 and len(set(found)) == 1, (errors, found)
        assert [p.name for p in path.parent.iterdir()] == ["secret.key"]  # no temporary left
        assert path.stat().st_mode & 0o777 == 0o600
