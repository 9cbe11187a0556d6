"""Integration fixtures shared by several modules: one real Kubernetes control plane and one
real PostgreSQL server per session, and the store on each backend."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.config import Settings
from provisioner.store.store import Store, open_store
from tests.peers.kube import KubeCluster, kube_unavailable_reason, running_kube
from tests.peers.postgres import PostgresServer, postgres_unavailable_reason, running_postgres

_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL 15 server (PEERS.md §11); each test takes a fresh database."""
    reason = postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Settings for a store on SQLite, then on a new PostgreSQL database."""
    if request.param == "sqlite":
        return Settings(state_dir=tmp_path / "state")
    server: PostgresServer = request.getfixturevalue("postgres")
    url = server.create_database(f"pv_test_{next(_databases)}")
    return Settings(state_dir=tmp_path / "state", database_url=url)


@pytest.fixture
def any_store(backend_settings: Settings) -> Iterator[Store]:
    opened = open_store(backend_settings)
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """etcd + kube-apiserver + kwok (PEERS.md §10), shared: tests use unique names."""
    if (reason := kube_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_kube() as cluster:
        yield cluster
