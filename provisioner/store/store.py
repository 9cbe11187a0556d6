"""Store: opens the database (engine, pool, secret key, schema check) and hands out repos."""

from __future__ import annotations

import os
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import Engine, func, or_
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from provisioner.config import Settings
from provisioner.errors import ConfigError
from provisioner.store import db
from provisioner.store.acceptance import AcceptanceRepo
from provisioner.store.bmc_secrets import BmcSecretRepo
from provisioner.store.files import private_dir
from provisioner.store.findings import FindingRepo
from provisioner.store.key_check import check_fleet_key, key_check_exists
from provisioner.store.models import NodeRow
from provisioner.store.ownership import OwnershipRepo
from provisioner.store.repo import NodeRepo
from provisioner.store.secretbox import SecretBox
from provisioner.store.tokens import TokenRepo
from provisioner.store.topology import TopologyRepo
from provisioner.store.waves import WaveRepo


@dataclass
class Store:
    engine: Engine
    pool: ThreadPoolExecutor
    boot_pool: ThreadPoolExecutor
    """The boot servers' own store threads (two): DHCP leases, MAC look-ups and agent
    tokens. On SQLite more connections: in a boot storm their short transactions wait for
    at most one write of the main pool (SQLite's lock, ``busy_timeout``), not for its whole
    queue of enrolments and transitions (which held every DHCP answer back by seconds, and
    every iPXE script by its token write)."""
    nodes: NodeRepo
    tokens: TokenRepo
    boot_tokens: TokenRepo
    """The same tokens through ``boot_pool``, for the boot servers (an iPXE script waits
    for its token's write, never for the main pool's queue)."""
    topology: TopologyRepo
    bmc_secrets: BmcSecretRepo
    ownership: OwnershipRepo
    acceptance: AcceptanceRepo
    findings: FindingRepo
    waves: WaveRepo

    @property
    def instance(self) -> str:
        return self.ownership.instance

    def close(self) -> None:
        self.ownership.close()
        self.boot_pool.shutdown(wait=True)
        self.pool.shutdown(wait=True)
        self.engine.dispose()


def instance_id(settings: Settings) -> str:
    """``ha.instance``, else hostname-pid-random: a new id at every start, so a restarted
    daemon never mistakes its dead incarnation's leases for its own."""
    if settings.ha.instance:
        return settings.ha.instance
    host = socket.gethostname().split(".")[0][:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"


def open_store(settings: Settings, *, migrate: bool | None = None,
               instance: str | None = None) -> Store:
    """Open the database; migrate when asked (default: ``store.auto_migrate``), else require
    the schema to be current. Raises SchemaError or ConfigError with a one-line reason."""
    private_dir(settings.state_dir)
    url = settings.sqlalchemy_url
    engine = db.make_engine(url)
    try:
        if migrate if migrate is not None else settings.store.auto_migrate:
            db.upgrade(engine)
        else:
            db.check_current(engine)
    except SQLAlchemyError as exc:  # unreachable, refused: one line, never the URL
        engine.dispose()
        cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        raise ConfigError(f"database_url: cannot use the database: "
                          f"{cause[0] if cause else type(exc).__name__}") from None
    sqlite = url.startswith("sqlite")
    workers = 1 if sqlite else settings.store.pool_size
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="store")
    me = instance or instance_id(settings)
    key_path = settings.state_dir / "secret.key"
    try:
        box = SecretBox.from_key_file(key_path, secrets_stored=_secrets_stored(engine)
                                      + key_check_exists(engine))
        check_fleet_key(engine, box, key_path=str(key_path), instance=me)
    except ConfigError:
        engine.dispose()
        raise
    # leases get their own threads: a backlog of step writes never delays a renewal
    lease_pool = pool if sqlite else ThreadPoolExecutor(max_workers=2,
                                                        thread_name_prefix="leases")
    ownership = OwnershipRepo(engine, lease_pool, instance=me, lease_s=settings.ha.lease_s,
                              exclusive=sqlite)
    boot_pool = ThreadPoolExecutor(max_workers=2,
                                   thread_name_prefix="store-boot")
    return Store(engine=engine, pool=pool, boot_pool=boot_pool,
                 nodes=NodeRepo(engine, pool, box, instance=me),
                 tokens=TokenRepo(engine, pool), boot_tokens=TokenRepo(engine, boot_pool),
                 topology=TopologyRepo(engine, pool),
                 bmc_secrets=BmcSecretRepo(engine, pool, box), ownership=ownership,
                 acceptance=AcceptanceRepo(engine, pool),
                 findings=FindingRepo(engine, pool), waves=WaveRepo(engine, pool))


def _secrets_stored(engine: Engine) -> int:
    """How many encrypted secrets the store holds (BMC passwords, current and pending)."""
    query = select(func.count()).select_from(NodeRow).where(or_(
        col(NodeRow.bmc_password_enc).is_not(None),
        col(NodeRow.bmc_password_pending_enc).is_not(None)))
    with Session(engine) as session:
        return int(session.exec(query).one())
