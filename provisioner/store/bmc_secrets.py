"""The BMC password rotation's two-phase record: a new password is stored (encrypted) as
*pending* before the BMC is told, and becomes the node's password only after a fresh login
with it worked; until then both are kept, so a crash at any point leaves a password the
BMC accepts. The history rows never hold a secret."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from provisioner.errors import NotFound
from provisioner.store.models import NodeRow, TransitionRow, utcnow
from provisioner.store.secretbox import SecretBox
from provisioner.store.session import SessionRepo


class BmcSecretRepo(SessionRepo):
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor, box: SecretBox) -> None:
        super().__init__(engine, pool)
        self._box = box

    async def pending(self, node_id: str) -> str | None:
        """The password being rotated in, decrypted; None when no rotation is open."""

        def work(s: Session) -> str | None:
            enc = _row(s, node_id).bmc_password_pending_enc
            return None if enc is None else self._box.decrypt(enc)

        return await self._run(work)

    async def begin(self, node_id: str, password: str) -> None:
        """Record ``password`` as pending (committed before the BMC hears of it)."""

        def work(s: Session) -> None:
            row = _row(s, node_id)
            row.bmc_password_pending_enc = self._box.encrypt(password)
            s.add(row)
            s.commit()

        await self._run(work)

    async def promote(self, node_id: str, *, username: str, event: str, actor: str,
                      reason: str) -> None:
        """The pending password becomes the node's, for ``username`` (a node that used the
        site default user stores it now): one transaction, one history row."""
        await self._end(node_id, promote=True, event=event, actor=actor, reason=reason,
                        username=username)

    async def abandon(self, node_id: str, *, event: str, actor: str, reason: str) -> None:
        """Forget the pending password; the current one stays."""
        await self._end(node_id, promote=False, event=event, actor=actor, reason=reason)

    async def _end(self, node_id: str, *, promote: bool, event: str, actor: str,
                   reason: str, username: str | None = None) -> None:
        def work(s: Session) -> None:
            row = _row(s, node_id)
            if row.bmc_password_pending_enc is None:
                return
            if promote:
                row.bmc_password_enc = row.bmc_password_pending_enc
                row.bmc_username = row.bmc_username or username
            row.bmc_password_pending_enc = None
            row.history_seq += 1
            row.version += 1
            row.updated_at = utcnow()
            s.add(row)
            s.add(TransitionRow(node_id=row.id, seq=row.history_seq, event=event,
                                from_state=row.state, to_state=row.state, actor=actor,
                                reason=reason))
            s.commit()

        await self._run(work)

    async def open_rotations(self) -> list[str]:
        """Nodes with a pending password (a rotation a crash interrupted)."""
        def work(s: Session) -> list[str]:
            rows = s.exec(select(NodeRow.id).where(
                col(NodeRow.bmc_password_pending_enc).is_not(None))).all()
            return [str(r) for r in rows]

        return await self._run(work)


def _row(s: Session, node_id: str) -> NodeRow:
    row = s.get(NodeRow, node_id)
    if row is None:
        raise NotFound("node", node_id)
    return row
