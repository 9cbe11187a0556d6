"""Store: opens the database (engine, pool, secret key, schema check) and hands out repos."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import Engine

from provisioner.config import Settings
from provisioner.store import db
from provisioner.store.bmc_secrets import BmcSecretRepo
from provisioner.store.repo import NodeRepo
from provisioner.store.secretbox import SecretBox
from provisioner.store.tokens import TokenRepo
from provisioner.store.topology import TopologyRepo


@dataclass
class Store:
    engine: Engine
    pool: ThreadPoolExecutor
    nodes: NodeRepo
    tokens: TokenRepo
    topology: TopologyRepo
    bmc_secrets: BmcSecretRepo

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.engine.dispose()


def open_store(settings: Settings, *, migrate: bool | None = None) -> Store:
    """Open the database; migrate when asked (default: ``store.auto_migrate``), else require
    the schema to be current. Raises SchemaError or ConfigError with a one-line reason."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    url = settings.sqlalchemy_url
    engine = db.make_engine(url)
    if migrate if migrate is not None else settings.store.auto_migrate:
        db.upgrade(engine)
    else:
        db.check_current(engine)
    workers = 1 if url.startswith("sqlite") else settings.store.pool_size
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="store")
    box = SecretBox.from_key_file(settings.state_dir / "secret.key")
    return Store(engine=engine, pool=pool, nodes=NodeRepo(engine, pool, box),
                 tokens=TokenRepo(engine, pool), topology=TopologyRepo(engine, pool),
                 bmc_secrets=BmcSecretRepo(engine, pool, box))
