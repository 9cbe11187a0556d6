"""Node rows ↔ domain values, and the query pieces the node repository shares: lookups by
key, filters, MAC lists, unique-conflict mapping. Runs inside a store session (blocking)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Table, or_
from sqlalchemy import select as sa_select
from sqlalchemy.exc import DataError, IntegrityError
from sqlmodel import Session, col, select

from provisioner.domain import BmcEndpoint, HistoryEntry, Node, NodeFilter, NodeState
from provisioner.errors import Conflict, InvalidRequest, NotFound
from provisioner.ids import NodeId, is_mac, normalize_mac
from provisioner.store.models import NodeMacRow, NodeRow, TransitionRow
from provisioner.store.secretbox import SecretBox

#: the tables themselves, for the per-node hot paths in SQL expressions (no ORM objects)
NODE: Table = NodeRow.__table__  # type: ignore[attr-defined]
MAC: Table = NodeMacRow.__table__  # type: ignore[attr-defined]
TRANSITION: Table = TransitionRow.__table__  # type: ignore[attr-defined]


def to_node(s: Session | Connection, row: Any, macs: Sequence[str] | None = None, *,
            facts: dict[str, Any] | None = None) -> Node:
    """``row``: a ``NodeRow``, or a row of ``NODE``'s columns (``read_node``); ``facts``:
    what to use instead of the row's (left unread where it is deferred)."""
    if macs is None:
        macs = macs_for(s, [row.id]).get(row.id, ())
    bmc = None
    if row.bmc_driver is not None:
        bmc = BmcEndpoint(driver=row.bmc_driver, address=row.bmc_address or "",
                          port=row.bmc_port, username=row.bmc_username,
                          password_set=row.bmc_password_enc is not None)
    return Node(
        id=NodeId(row.id), state=NodeState(row.state), hostname=row.hostname,
        serial=row.serial, macs=tuple(macs), maintenance=row.maintenance,
        maintenance_reason=row.maintenance_reason, profile=row.profile, rack=row.rack,
        position=row.position, facts=json.loads(row.facts) if facts is None else facts,
        last_error=row.last_error,
        checkpoint=tuple(json.loads(row.checkpoint)), version=row.version,
        history_seq=row.history_seq, bmc=bmc, created_at=row.created_at,
        updated_at=row.updated_at, power_state=row.power_state, bmc_mac=row.bmc_mac,
    )


def apply_bmc(row: NodeRow, bmc: BmcEndpoint | None, password: str | None,
              box: SecretBox, *, keep_password: bool = False) -> None:
    """Set the row's BMC endpoint (and password, when given). An endpoint that moves
    (driver, address or port) without a new password loses the stored one, a rotation's
    pending one too, unless ``keep_password``: a password goes only where it was entered."""
    if bmc is None:
        return
    moved = (row.bmc_driver, row.bmc_address, row.bmc_port) != (bmc.driver, bmc.address,
                                                                bmc.port)
    if moved and password is None and not keep_password:
        row.bmc_password_enc = row.bmc_password_pending_enc = None
    row.bmc_driver, row.bmc_address = bmc.driver, bmc.address
    row.bmc_port, row.bmc_username = bmc.port, bmc.username
    if password is not None:
        row.bmc_password_enc = box.encrypt(password)


def get_row(s: Session, node_id: str) -> NodeRow:
    row = s.get(NodeRow, node_id)
    if row is None:
        raise NotFound("node", node_id)
    return row


def find_row(s: Session, key: str) -> NodeRow:
    row = s.get(NodeRow, key)
    if row is None and is_mac(key):
        mac_row = s.get(NodeMacRow, normalize_mac(key))
        row = s.get(NodeRow, mac_row.node_id) if mac_row else None
    if row is None:
        row = s.exec(select(NodeRow).where(
            or_(col(NodeRow.hostname) == key, col(NodeRow.serial) == key))).first()
    if row is None:
        raise NotFound("node", key)
    return row


def filtered(query: Any, flt: NodeFilter) -> Any:
    for column, wanted in ((NodeRow.state, flt.state), (NodeRow.rack, flt.rack),
                           (NodeRow.profile, flt.profile)):
        if isinstance(wanted, str):
            query = query.where(col(column) == wanted)
        elif wanted is not None:
            query = query.where(col(column).in_(wanted))
    if flt.maintenance is not None:
        query = query.where(col(NodeRow.maintenance) == flt.maintenance)
    if flt.query:
        pattern = f"%{escape_like(flt.query)}%"
        mac_match = select(NodeMacRow.node_id).where(
            col(NodeMacRow.mac).like(f"%{escape_like(flt.query.lower())}%", escape="\\"))
        query = query.where(or_(
            col(NodeRow.hostname).like(pattern, escape="\\"),
            col(NodeRow.serial).like(pattern, escape="\\"),
            col(NodeRow.id).in_(mac_match),
        ))
    return query


def escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def macs_for(s: Session | Connection, node_ids: list[str]) -> dict[str, tuple[str, ...]]:
    if not node_ids:
        return {}
    found: dict[str, list[str]] = {}
    rows = s.execute(sa_select(MAC.c.node_id, MAC.c.mac).where(MAC.c.node_id.in_(node_ids))
                     .order_by(MAC.c.mac))
    for node_id, mac in rows:
        found.setdefault(node_id, []).append(mac)
    return {node_id: tuple(macs) for node_id, macs in found.items()}


def commit_unique(s: Session, kind: str) -> None:
    try:
        s.commit()
    except (IntegrityError, DataError) as exc:
        s.rollback()
        raise refused(kind, exc) from exc


def refused(kind: str, exc: IntegrityError | DataError) -> Conflict | InvalidRequest:
    """What the caller is told of a write the database refused: a unique value taken
    (Conflict), or (PostgreSQL) a value longer than its column, say (InvalidRequest)."""
    if isinstance(exc, IntegrityError):
        return Conflict(f"{kind} conflicts with an existing one: {_which_unique(exc)}")
    return InvalidRequest(f"{kind} has a value the database refuses: "
                          f"{str(exc.orig).splitlines()[0]}")


def _which_unique(exc: IntegrityError) -> str:
    text = str(exc.orig).lower()
    for field in ("hostname", "serial", "mac", "name"):
        if field in text:
            return f"{field} already in use"
    return "a unique field is already in use"


def to_entry(row: TransitionRow) -> HistoryEntry:
    return HistoryEntry(node_id=NodeId(row.node_id), seq=row.seq, event=row.event,
                        from_state=row.from_state, to_state=row.to_state, actor=row.actor,
                        reason=row.reason, at=row.created_at, instance=row.instance,
                        fence=row.fence)
