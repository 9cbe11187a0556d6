"""A real PostgreSQL 15 server started by the test (PEERS.md §11).

Tests call postgres_unavailable_reason() and pytest.skip() on a reason, then
`with running_postgres() as pg:` and `pg.create_database(name)` for the SQLAlchemy URL of a
new, empty database. The server runs as user postgres (initdb refuses root) on a free
loopback port, with its data in a fresh directory under /tmp; all is gone after the block.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote

import psycopg
from psycopg import sql

from tests.peers.ports import free_tcp_port, stop_process

PG_BIN: Final = Path("/usr/lib/postgresql/15/bin")
PG_USER: Final = "postgres"  # the OS user that runs the server when we are root
READY_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 10.0
_ENV: Final = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


@dataclass(frozen=True, slots=True)
class PostgresServer:
    port: int
    url: str  # SQLAlchemy URL of the "postgres" database
    pid: int = 0  # the postmaster's (benches read its CPU and its children's from /proc)
    socket_dir: str = ""  # its Unix socket: reachable from every network namespace

    def unix_url(self, url: str) -> str:
        """``url`` (of ``create_database``) through the Unix socket instead: for a process
        started inside a test's network namespace, where 127.0.0.1 is not this one's."""
        return url.replace(f"@127.0.0.1:{self.port}/", "@/") + (
            f"?host={quote(self.socket_dir, safe='')}&port={self.port}")

    def dsn(self, dbname: str = "postgres") -> str:
        """libpq URL, for psycopg.connect()."""
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    def create_database(self, name: str) -> str:
        """Create an empty database; return its SQLAlchemy URL."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return _sqlalchemy_url(self.port, name)


def postgres_unavailable_reason() -> str | None:
    """Why running_postgres() cannot work here, or None if it can."""
    for tool in ("initdb", "postgres", "pg_isready"):
        if not os.access(PG_BIN / tool, os.X_OK):
            return f"{PG_BIN / tool} not found: apt-get install postgresql-15 (scripts/setup.sh)"
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            return f"running as root and there is no {PG_USER!r} system user to run the server as"
    return None


@dataclass(frozen=True, slots=True)
class _RunAs:
    """Credentials for the server's processes; all None = keep ours (we are not root)."""

    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] | None = None  # () drops root's supplementary groups

    @classmethod
    def postgres_if_root(cls) -> _RunAs:
        if os.geteuid() != 0:
            return cls()
        entry = pwd.getpwnam(PG_USER)
        return cls(entry.pw_uid, entry.pw_gid, ())


@contextmanager
def running_postgres(settings: Sequence[str] = ()) -> Iterator[PostgresServer]:
    """Start a throwaway server on a free loopback port; stop it and delete its files on exit.

    ``settings`` are more ``name=value`` server settings (``-c``), e.g. a bench's
    ``shared_preload_libraries=pg_stat_statements``."""
    reason = postgres_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    as_user = _RunAs.postgres_if_root()
    # Not pytest's tmp_path: /tmp/pytest-of-root is mode 0700, unreachable for user postgres.
    workdir = Path(tempfile.mkdtemp(prefix="provisioner-pg-", dir="/tmp"))
    try:
        if as_user.uid is not None and as_user.gid is not None:
            os.chown(workdir, as_user.uid, as_user.gid)
        _initdb(workdir, as_user)
        port = free_tcp_port()
        cmd = [str(PG_BIN / "postgres"), "-D", str(workdir / "data"), "-h", "127.0.0.1",
               "-p", str(port), "-k", str(workdir), "-c", "fsync=off",
               "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]  # fmt: skip
        for setting in settings:
            cmd += ["-c", setting]
        with (workdir / "postgres.log").open("wb") as log_file:
            proc = subprocess.Popen(
                cmd,
                user=as_user.uid,
                group=as_user.gid,
                extra_groups=as_user.groups,
                cwd=workdir,
                env=_ENV,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_ready(proc, port, workdir / "postgres.log")
            yield PostgresServer(port=port, url=_sqlalchemy_url(port, "postgres"), pid=proc.pid,
                                 socket_dir=str(workdir))
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _sqlalchemy_url(port: int, dbname: str) -> str:
    return f"postgresql+psycopg://{PG_USER}@127.0.0.1:{port}/{quote(dbname, safe='')}"


def _initdb(workdir: Path, as_user: _RunAs) -> None:
    cmd = [str(PG_BIN / "initdb"), "-D", str(workdir / "data"), "-U", PG_USER,
           "-A", "trust", "-E", "UTF8", "--no-locale", "-N"]  # fmt: skip
    done = subprocess.run(
        cmd,
        user=as_user.uid,
        group=as_user.gid,
        extra_groups=as_user.groups,
        cwd=workdir,
        env=_ENV,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed (rc {done.returncode}):\n{done.stdout}{done.stderr}")



def _wait_ready(proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    probe = [str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-t", "1"]
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited with rc {proc.returncode}:\n{_tail(log_path)}")
        if subprocess.run(probe, env=_ENV, check=False, timeout=10).returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"postgres not ready after {READY_TIMEOUT_S} s:\n{_tail(log_path)}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    stop_process(proc, STOP_TIMEOUT_S, signal.SIGINT)  # fast shutdown: drops connections


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
