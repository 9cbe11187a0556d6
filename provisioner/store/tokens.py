"""API and agent tokens: random, shown once, stored only as a SHA-256 hash."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from sqlalchemy import Connection, Engine, delete, insert, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from provisioner.domain import Role, TokenInfo
from provisioner.errors import Conflict, NotFound
from provisioner.ids import NodeId
from provisioner.store.batch import TxnBatcher
from provisioner.store.models import ApiTokenRow
from provisioner.store.session import SessionRepo

T = TypeVar("T")
TOKEN_PREFIX = "pvt_"


def expiry(default_s: float | None, *, expires_in_s: float | None = None,
           no_expiry: bool = False, now: datetime | None = None) -> datetime | None:
    """When a new API token expires: its own lifetime, else the site default
    (``api.token_lifetime_days``); None when it never does."""
    if no_expiry:
        return None
    lifetime = expires_in_s if expires_in_s is not None else default_s
    if lifetime is None:
        return None
    return (now or datetime.now(UTC)) + timedelta(seconds=lifetime)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_row(name: str, role: Role, node_id: str | None,
             expires_at: datetime | None) -> tuple[ApiTokenRow, str]:
    """A token's row (its hash only) and the plaintext, shown once."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return ApiTokenRow(id=secrets.token_hex(6), name=name, role=str(role),
                       token_hash=hash_token(token), node_id=node_id,
                       expires_at=expires_at), token


def _commit_new(s: Session, row: ApiTokenRow) -> None:
    s.add(row)
    try:
        s.commit()
    except IntegrityError:
        raise Conflict(f"a token named {row.name!r} already exists") from None


class TokenRepo(SessionRepo):
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor) -> None:
        super().__init__(engine, pool)
        self._batch = TxnBatcher(engine, pool, lambda: datetime.now(UTC))

    def create_blocking(
        self, name: str, role: Role, *, node_id: str | None = None,
        expires_at: datetime | None = None,
    ) -> tuple[TokenInfo, str]:
        """Create a token; return its info and the plaintext, which is never stored."""
        row, token = _new_row(name, role, node_id, expires_at)
        with Session(self._engine, expire_on_commit=False) as session:
            _commit_new(session, row)
        return _to_info(row), token

    async def create(
        self, name: str, role: Role, *, node_id: str | None = None,
        expires_at: datetime | None = None,
    ) -> tuple[TokenInfo, str]:
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: self.create_blocking(name, role, node_id=node_id,
                                                     expires_at=expires_at))

    def list_blocking(self) -> list[TokenInfo]:
        """The API tokens (not the daemon's per-node agent tokens), oldest first; never a
        secret (only hashes are stored)."""
        with Session(self._engine) as session:
            rows = session.exec(select(ApiTokenRow)
                                .where(col(ApiTokenRow.role) != str(Role.AGENT))
                                .order_by(col(ApiTokenRow.created_at))).all()
            return [_to_info(row) for row in rows]

    async def api_tokens(self) -> list[TokenInfo]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.list_blocking)

    def revoke_blocking(self, key: str) -> TokenInfo:
        """Delete the API token whose id or name is ``key``; NotFound when there is none
        (agent tokens are the daemon's: revoked with their node's step, never here)."""
        with Session(self._engine) as session:
            row = session.exec(select(ApiTokenRow).where(
                or_(col(ApiTokenRow.id) == key, col(ApiTokenRow.name) == key),
                col(ApiTokenRow.role) != str(Role.AGENT))).first()
            if row is None:
                raise NotFound("token", key)
            info = _to_info(row)
            session.delete(row)
            session.commit()
            return info

    async def revoke(self, key: str) -> TokenInfo:
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: self.revoke_blocking(key))

    async def lookup(self, token: str) -> TokenInfo | None:
        """The token's info, or None when it is unknown or expired."""
        digest = hash_token(token)

        def work(s: Session) -> TokenInfo | None:
            row = s.exec(select(ApiTokenRow).where(ApiTokenRow.token_hash == digest)).first()
            if row is None:
                return None
            if row.expires_at is not None and _aware(row.expires_at) <= datetime.now(UTC):
                return None
            return _to_info(row)

        return await self._run(work)

    async def revoke_for_node(self, node_id: str) -> int:
        def work(s: Session) -> int:
            result = s.execute(delete(ApiTokenRow).where(col(ApiTokenRow.node_id) == node_id))
            s.commit()
            return int(result.rowcount)  # type: ignore[attr-defined]

        return await self._run(work)

    async def replace_for_node(self, name: str, role: Role, *, node_id: str,
                               expires_at: datetime,
                               keep_valid: bool = False) -> tuple[TokenInfo, str]:
        """The node's tokens revoked (with ``keep_valid``, only its expired ones: an agent
        holding an earlier one goes on until it expires) and a new one created, in one
        transaction (a node's iPXE script costs one write, not two), committed with the
        other nodes' that wait at the same moment (a boot storm's scripts: one commit for a
        burst of them)."""
        row, token = _new_row(name, role, node_id, expires_at)
        values = row.model_dump()

        def work(conn: Connection, now: datetime) -> None:
            old = delete(ApiTokenRow).where(col(ApiTokenRow.node_id) == node_id)
            if keep_valid:
                old = old.where(col(ApiTokenRow.expires_at) <= now)
            conn.execute(old)
            conn.execute(insert(ApiTokenRow).values(values))

        try:
            await self._retried(lambda: self._batch.run(work))
        except IntegrityError:
            raise Conflict(f"a token named {name!r} already exists") from None
        return _to_info(row), token

    async def delete_expired(self) -> int:
        """Delete tokens past their expiry (``lookup`` refuses them already)."""
        def work(s: Session) -> int:
            result = s.execute(delete(ApiTokenRow).where(
                col(ApiTokenRow.expires_at) <= datetime.now(UTC)))
            s.commit()
            return int(result.rowcount)  # type: ignore[attr-defined]

        return await self._run(work)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _to_info(row: ApiTokenRow) -> TokenInfo:
    return TokenInfo(id=row.id, name=row.name, role=Role(row.role),
                     node_id=NodeId(row.node_id) if row.node_id else None,
                     expires_at=_aware(row.expires_at) if row.expires_at else None,
                     created_at=_aware(row.created_at))
