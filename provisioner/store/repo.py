"""NodeRepo: the only SQL in the daemon. Blocking work runs in the bounded ``store`` pool.

State changes are compare-and-set on ``node.version`` and write their history row in the
same transaction, so a crash can never leave a state without its history or vice versa.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, delete, func, or_, update
from sqlalchemy import select as sa_select
from sqlalchemy.exc import DataError, IntegrityError
from sqlmodel import Session, col, select

from provisioner.domain import (
    BmcCredentials,
    BmcEndpoint,
    HistoryEntry,
    NewNode,
    Node,
    NodeFilter,
    NodeState,
    NodeSummary,
)
from provisioner.errors import Conflict, Fenced, InvalidRequest, NodeBusy, NotFound
from provisioner.ids import NodeId, is_mac, new_node_id, normalize_mac
from provisioner.store import notify
from provisioner.store.models import (
    ApiTokenRow,
    LeaseRow,
    NodeLeaseRow,
    NodeMacRow,
    NodeRow,
    TransitionRow,
    utcnow,
)
from provisioner.store.secretbox import SecretBox
from provisioner.store.session import SessionRepo

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeChange:
    """Metadata an operator or an import may change; None leaves a field alone."""

    hostname: str | None = None
    serial: str | None = None
    profile: str | None = None
    rack: str | None = None
    position: str | None = None
    bmc: BmcEndpoint | None = None
    bmc_password: str | None = None
    bmc_mac: str | None = None


class NodeRepo(SessionRepo):
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor, box: SecretBox, *,
                 instance: str | None = None) -> None:
        """``instance``: this daemon's id, written on every history row and checked (with
        the fencing number) by fenced writes."""
        super().__init__(engine, pool)
        self._box = box
        self.instance = instance

    def _check_fence(self, s: Session, node_id: str, fence: int | None) -> None:
        """Refuse the write unless we still hold the node's lease with ``fence``. The row
        stays share-locked to the end of the transaction, so no claim slips in between
        (PostgreSQL; SQLite has one daemon)."""
        if fence is None:
            return
        held = s.exec(select(NodeLeaseRow.fence).where(
            col(NodeLeaseRow.node_id) == node_id, col(NodeLeaseRow.owner) == self.instance,
            col(NodeLeaseRow.fence) == fence).with_for_update(read=True)).first()
        if held is None:
            s.rollback()
            log.warning("node %s: write refused by fencing: instance %s lost its lease "
                        "(fence %d)", node_id, self.instance, fence)
            raise Fenced(f"node {node_id}: write refused, instance {self.instance} no longer "
                         f"holds its lease (fence {fence})")

    def _release(self, s: Session, node_id: str, fence: int | None) -> None:
        if fence is not None:
            s.execute(update(NodeLeaseRow).where(
                col(NodeLeaseRow.node_id) == node_id, col(NodeLeaseRow.owner) == self.instance,
                col(NodeLeaseRow.fence) == fence).values(owner=None, expires_at=None))

    # -- reads ------------------------------------------------------------------------------

    async def get(self, node_id: str) -> Node:
        return await self._run(lambda s: self._to_node(s, _get_row(s, node_id)))

    async def find(self, key: str) -> Node:
        """Look a node up by id, hostname, serial or MAC."""
        return await self._run(lambda s: self._to_node(s, _find_row(s, key)))

    async def find_by_serial(self, serial: str) -> Node | None:
        def work(s: Session) -> Node | None:
            row = s.exec(select(NodeRow).where(col(NodeRow.serial) == serial)).first()
            return None if row is None else self._to_node(s, row)

        return await self._run(work)

    async def list(
        self, flt: NodeFilter, *, limit: int, offset: int
    ) -> tuple[builtins.list[Node], int]:
        def work(s: Session) -> tuple[builtins.list[Node], int]:
            query = _filtered(select(NodeRow), flt)
            total = s.exec(_filtered(select(func.count()).select_from(NodeRow), flt)).one()
            rows = s.exec(query.order_by(col(NodeRow.created_at), col(NodeRow.id))
                          .offset(offset).limit(limit)).all()
            macs = _macs_for(s, [r.id for r in rows])
            return [self._to_node(s, r, macs.get(r.id, ())) for r in rows], int(total)

        return await self._run(work)

    async def in_states(self, states: Iterable[NodeState]) -> builtins.list[Node]:
        wanted = [str(st) for st in states]

        def work(s: Session) -> builtins.list[Node]:
            rows = s.exec(select(NodeRow).where(col(NodeRow.state).in_(wanted))).all()
            macs = _macs_for(s, [r.id for r in rows])
            return [self._to_node(s, r, macs.get(r.id, ())) for r in rows]

        return await self._run(work)

    async def stamps(self, states: Iterable[NodeState]) -> dict[str, tuple[str, datetime]]:
        """``{id: (state, updated_at)}`` of the nodes in ``states``, without their facts: a
        poller re-reads (``get``) only the nodes whose stamp changed since it last looked."""
        wanted = [str(st) for st in states]

        def work(s: Session) -> dict[str, tuple[str, datetime]]:
            rows = s.exec(select(NodeRow.id, NodeRow.state, NodeRow.updated_at)
                          .where(col(NodeRow.state).in_(wanted))).all()
            return {node_id: (state, updated) for node_id, state, updated in rows}

        return await self._run(work)

    async def serials(self) -> frozenset[str]:
        def work(s: Session) -> frozenset[str]:
            rows = s.exec(select(NodeRow.serial).where(col(NodeRow.serial).is_not(None))).all()
            return frozenset(serial for serial in rows if serial is not None)

        return await self._run(work)

    async def count_by_state(self) -> dict[str, int]:
        def work(s: Session) -> dict[str, int]:
            query = select(NodeRow.state, func.count()).group_by(col(NodeRow.state))
            return {state: int(n) for state, n in s.exec(query).all()}

        return await self._run(work)

    async def naming_clique(self, clique: str) -> builtins.list[Node]:
        """Nodes whose stored facts name NVLink ``clique`` (a text match on the JSON, which
        is written with ``json.dumps``: the caller confirms with the parsed record). Reads
        one domain's nodes, not the fleet's."""
        needle = "%" + _escape_like('"clique": ' + json.dumps(clique)) + "%"

        def work(s: Session) -> builtins.list[Node]:
            rows = s.exec(select(NodeRow).where(
                col(NodeRow.facts).like(needle, escape="\\"))).all()
            macs = _macs_for(s, [r.id for r in rows])
            return [self._to_node(s, r, macs.get(r.id, ())) for r in rows]

        return await self._run(work)

    async def clique_stamps(self, states: Iterable[NodeState],
                            ) -> dict[str, tuple[str, datetime]]:
        """``stamps`` of the nodes in ``states`` whose facts name some NVLink clique (the
        same text match as ``naming_clique``): the nodes a view of the domains must read."""
        wanted = [str(st) for st in states]
        needle = "%" + _escape_like('"clique": "') + "%"

        def work(s: Session) -> dict[str, tuple[str, datetime]]:
            rows = s.exec(select(NodeRow.id, NodeRow.state, NodeRow.updated_at).where(
                col(NodeRow.state).in_(wanted),
                col(NodeRow.facts).like(needle, escape="\\"))).all()
            return {node_id: (state, updated) for node_id, state, updated in rows}

        return await self._run(work)

    async def get_many(self, node_ids: Sequence[str]) -> builtins.list[Node]:
        """The nodes of ``node_ids`` that exist, in one query."""
        def work(s: Session) -> builtins.list[Node]:
            rows = s.exec(select(NodeRow).where(col(NodeRow.id).in_(list(node_ids)))).all()
            macs = _macs_for(s, [r.id for r in rows])
            return [self._to_node(s, r, macs.get(r.id, ())) for r in rows]

        return await self._run(work)

    async def page(self, flt: NodeFilter, *, limit: int, offset: int,
                   ) -> tuple[builtins.list[NodeSummary], int]:
        """``list`` without facts or MACs (a node's facts may be megabytes): the console's
        node table."""
        def work(s: Session) -> tuple[builtins.list[NodeSummary], int]:
            c = NodeRow.__table__.c  # type: ignore[attr-defined]
            query = _filtered(sa_select(
                c.id, c.hostname, c.state, c.maintenance, c.rack, c.position, c.profile,
                c.power_state, c.last_error, c.maintenance_reason), flt)
            total = s.exec(_filtered(select(func.count()).select_from(NodeRow), flt)).one()
            rows = s.connection().execute(
                query.order_by(c.created_at, c.id).offset(offset).limit(limit)).all()
            return [NodeSummary(NodeId(r[0]), r[1], r[2], bool(r[3]), *r[4:]) for r in rows], \
                int(total)

        return await self._run(work)

    async def rack_stamps(self) -> dict[str | None, tuple[int, datetime]]:
        """{rack: (node count, newest ``updated_at``)}: a rack's stamp changes whenever one of
        its nodes does (every write sets ``updated_at``), so views per rack can be cached."""
        def work(s: Session) -> dict[str | None, tuple[int, datetime]]:
            rows = s.exec(select(NodeRow.rack, func.count(), func.max(NodeRow.updated_at))
                          .group_by(col(NodeRow.rack))).all()
            return {rack: (int(count), newest) for rack, count, newest in rows}

        return await self._run(work)

    async def summaries(self, racks: Iterable[str | None] | None = None,
                        ) -> builtins.list[NodeSummary]:
        """Nodes, light (no facts, no MACs), of ``racks`` (None: every node): the console's
        rack elevation and counts."""
        wanted = None if racks is None else set(racks)

        def work(s: Session) -> builtins.list[NodeSummary]:
            c = NodeRow.__table__.c  # type: ignore[attr-defined]  # plain rows: no ORM objects
            query = sa_select(c.id, c.hostname, c.state, c.maintenance, c.rack, c.position)
            if wanted is not None:
                named = [r for r in wanted if r is not None]
                query = query.where(or_(c.rack.in_(named), c.rack.is_(None)) if None in wanted
                                    else c.rack.in_(named))
            rows = s.connection().execute(query).all()
            return [NodeSummary(NodeId(i), h, st, bool(m), r, p) for i, h, st, m, r, p in rows]

        return await self._run(work)

    async def history(self, node_id: str) -> builtins.list[HistoryEntry]:
        def work(s: Session) -> builtins.list[HistoryEntry]:
            _get_row(s, node_id)
            rows = s.exec(select(TransitionRow).where(TransitionRow.node_id == node_id)
                          .order_by(col(TransitionRow.seq))).all()
            return [_to_entry(r) for r in rows]

        return await self._run(work)

    async def credentials(self, node_id: str) -> BmcCredentials:
        def work(s: Session) -> BmcCredentials:
            row = _get_row(s, node_id)
            password = None
            if row.bmc_password_enc is not None:
                password = self._box.decrypt(row.bmc_password_enc)
            return BmcCredentials(username=row.bmc_username, password=password)

        return await self._run(work)

    # -- writes -----------------------------------------------------------------------------

    async def create(self, new: NewNode, *, actor: str, reason: str = "") -> Node:
        def work(s: Session) -> Node:
            row = NodeRow(id=new_node_id(), state=str(new.state), hostname=new.hostname,
                          serial=new.serial, profile=new.profile, rack=new.rack,
                          position=new.position, version=1, history_seq=1)
            self._apply_bmc(row, new.bmc, new.bmc_password)
            s.add(row)
            _commit_unique(s, "node", flush_only=True)  # the node row first: the FKs need it
            for mac in new.macs:
                s.add(NodeMacRow(mac=normalize_mac(mac), node_id=row.id))
            s.add(NodeLeaseRow(node_id=row.id))
            s.add(TransitionRow(node_id=row.id, seq=1, event="enroll", from_state="",
                                to_state=str(new.state), actor=actor, reason=reason,
                                instance=self.instance))
            _commit_unique(s, "node")
            # after the commit (a unique conflict must surface above as Conflict): other
            # daemons drop these MACs from their negative caches
            notify.send(s, self.instance, row.id, [normalize_mac(m) for m in new.macs])
            s.commit()
            return self._to_node(s, row)

        return await self._run(work)

    async def update_meta(self, node_id: str, change: NodeChange) -> Node:
        def work(s: Session) -> Node:
            row = _get_row(s, node_id)
            for name in ("hostname", "serial", "profile", "rack", "position"):
                value = getattr(change, name)
                if value is not None:
                    setattr(row, name, value)
            if change.bmc is not None:
                self._apply_bmc(row, change.bmc, change.bmc_password)
            if change.bmc_mac is not None:
                row.bmc_mac = change.bmc_mac
            row.updated_at = utcnow()
            s.add(row)
            _commit_unique(s, "node")
            return self._to_node(s, row)

        return await self._run(work)

    async def transition(
        self,
        node: Node,
        *,
        to_state: NodeState,
        event: str,
        actor: str,
        reason: str = "",
        last_error: str | None = None,
        reset_checkpoint: bool = True,
        maintenance: tuple[bool, str] | None = None,
        fence: int | None = None,
        release: bool = False,
    ) -> Node:
        """CAS the node from ``node.version`` to ``to_state`` and append one history row.
        ``fence``: only while we hold the node's lease with it (else Fenced); ``release``:
        free that lease in the same transaction (the step ended)."""

        def work(s: Session) -> Node:
            self._check_fence(s, node.id, fence)
            now = utcnow()
            values: dict[str, Any] = {
                "state": str(to_state),
                "version": node.version + 1,
                "history_seq": node.history_seq + 1,
                "updated_at": now,
            }
            if last_error is not None:
                values["last_error"] = last_error
            if reset_checkpoint:
                values["checkpoint"] = "[]"
            if maintenance is not None:
                values["maintenance"], values["maintenance_reason"] = maintenance
            result = s.execute(
                update(NodeRow)
                .where(col(NodeRow.id) == node.id, col(NodeRow.version) == node.version)
                .values(**values)
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                s.rollback()
                raise NodeBusy(f"node {node.id} changed concurrently; retry")
            s.add(TransitionRow(node_id=node.id, seq=node.history_seq + 1, event=event,
                                from_state=str(node.state), to_state=str(to_state),
                                actor=actor, reason=reason, created_at=now,
                                instance=self.instance, fence=fence))
            if release:
                self._release(s, node.id, fence)
            notify.send(s, self.instance, node.id, node.macs)
            s.commit()
            # The CAS proved nobody else wrote: the new node is the old one plus our values.
            changed: dict[str, Any] = {"state": to_state, "version": node.version + 1,
                                       "history_seq": node.history_seq + 1, "updated_at": now}
            if last_error is not None:
                changed["last_error"] = last_error
            if reset_checkpoint:
                changed["checkpoint"] = ()
            if maintenance is not None:
                changed["maintenance"], changed["maintenance_reason"] = maintenance
            return dataclasses.replace(node, **changed)

        return await self._run(work)

    async def adopt(self, discovered: Node, owner: Node, *, actor: str, reason: str) -> Node:
        """Fold a discovered node into the enrolled one with the same serial: its MACs and
        leases move over, it is deleted, and the owner's history records the adoption."""
        def work(s: Session) -> Node:
            s.execute(update(NodeMacRow).where(col(NodeMacRow.node_id) == discovered.id)
                      .values(node_id=owner.id))
            s.execute(update(LeaseRow).where(col(LeaseRow.node_id) == discovered.id)
                      .values(node_id=owner.id))
            s.execute(delete(ApiTokenRow).where(col(ApiTokenRow.node_id) == discovered.id))
            s.execute(delete(TransitionRow).where(col(TransitionRow.node_id) == discovered.id))
            s.execute(delete(NodeLeaseRow).where(col(NodeLeaseRow.node_id) == discovered.id))
            s.execute(delete(NodeRow).where(col(NodeRow.id) == discovered.id))
            result = s.execute(
                update(NodeRow)
                .where(col(NodeRow.id) == owner.id, col(NodeRow.version) == owner.version)
                .values(version=owner.version + 1, history_seq=owner.history_seq + 1,
                        updated_at=utcnow())
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                s.rollback()
                raise NodeBusy(f"node {owner.id} changed concurrently; retry")
            s.add(TransitionRow(node_id=owner.id, seq=owner.history_seq + 1, event="adopt",
                                from_state=str(owner.state), to_state=str(owner.state),
                                actor=actor, reason=reason, instance=self.instance))
            notify.send(s, self.instance, owner.id, (*owner.macs, *discovered.macs))
            notify.send(s, self.instance, discovered.id, discovered.macs)
            s.commit()
            return self._to_node(s, _get_row(s, owner.id))

        return await self._run(work)

    async def save_checkpoint(self, node: Node, checkpoint: Sequence[str], *,
                              power_state: str | None = None,
                              fence: int | None = None) -> Node:
        """Record finished sub-steps of the step running for ``node.state`` (and the power
        state the sub-step set, in the same write).

        Conditional on the state, not the version: a transition (abort) wins over a step."""
        values: dict[str, Any] = {"checkpoint": json.dumps(list(checkpoint))}
        if power_state is not None:
            values |= {"power_state": power_state, "power_checked_at": utcnow()}

        def work(s: Session) -> Node:
            self._check_fence(s, node.id, fence)
            result = s.execute(
                update(NodeRow)
                .where(col(NodeRow.id) == node.id, col(NodeRow.state) == str(node.state))
                .values(**values, updated_at=utcnow())
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                s.rollback()
                raise NodeBusy(f"node {node.id} left {node.state} while its step ran")
            s.commit()
            if power_state is not None:
                return dataclasses.replace(node, checkpoint=tuple(checkpoint),
                                           power_state=power_state)
            return dataclasses.replace(node, checkpoint=tuple(checkpoint))

        return await self._run(work)

    async def merge_facts(self, node_id: str, facts: dict[str, Any]) -> Node:
        def work(s: Session) -> Node:
            row = _get_row(s, node_id)
            merged = json.loads(row.facts) | facts
            row.facts = json.dumps(merged, sort_keys=True)
            row.updated_at = utcnow()
            s.add(row)
            s.commit()
            return self._to_node(s, row)

        return await self._run(work)

    async def with_bmc(self) -> builtins.list[Node]:
        """Every node with a BMC endpoint (the power-state sync reads them all)."""

        def work(s: Session) -> builtins.list[Node]:
            rows = s.exec(select(NodeRow).where(col(NodeRow.bmc_driver).is_not(None))
                          .order_by(col(NodeRow.id))).all()
            macs = _macs_for(s, [r.id for r in rows])
            return [self._to_node(s, r, macs.get(r.id, ())) for r in rows]

        return await self._run(work)

    async def note_power(self, node_id: str, power_state: str) -> None:
        """Store a power state we set or read ourselves: no history row, no version bump."""

        def work(s: Session) -> None:
            s.execute(update(NodeRow).where(col(NodeRow.id) == node_id)
                      .values(power_state=power_state, power_checked_at=utcnow()))
            s.commit()

        await self._run(work)

    async def record_power(self, node: Node, power_state: str, *, event: str, actor: str,
                           reason: str) -> Node:
        """CAS the node's power state from ``node.version``, with one history row whose
        from and to states are the node's (unchanged) lifecycle state."""

        def work(s: Session) -> Node:
            result = s.execute(
                update(NodeRow)
                .where(col(NodeRow.id) == node.id, col(NodeRow.version) == node.version)
                .values(power_state=power_state, power_checked_at=utcnow(),
                        version=node.version + 1, history_seq=node.history_seq + 1,
                        updated_at=utcnow()))
            if result.rowcount != 1:  # type: ignore[attr-defined]
                s.rollback()
                raise NodeBusy(f"node {node.id} changed concurrently; retry")
            s.add(TransitionRow(node_id=node.id, seq=node.history_seq + 1, event=event,
                                from_state=str(node.state), to_state=str(node.state),
                                actor=actor, reason=reason, instance=self.instance))
            s.commit()
            return self._to_node(s, _get_row(s, node.id))

        return await self._run(work)

    # -- mapping ----------------------------------------------------------------------------

    def _apply_bmc(self, row: NodeRow, bmc: BmcEndpoint | None, password: str | None) -> None:
        if bmc is None:
            return
        row.bmc_driver, row.bmc_address = bmc.driver, bmc.address
        row.bmc_port, row.bmc_username = bmc.port, bmc.username
        if password is not None:
            row.bmc_password_enc = self._box.encrypt(password)

    def _to_node(self, s: Session, row: NodeRow, macs: Sequence[str] | None = None) -> Node:
        if macs is None:
            macs = _macs_for(s, [row.id]).get(row.id, ())
        bmc = None
        if row.bmc_driver is not None:
            bmc = BmcEndpoint(driver=row.bmc_driver, address=row.bmc_address or "",
                              port=row.bmc_port, username=row.bmc_username,
                              password_set=row.bmc_password_enc is not None)
        return Node(
            id=NodeId(row.id), state=NodeState(row.state), hostname=row.hostname,
            serial=row.serial, macs=tuple(macs), maintenance=row.maintenance,
            maintenance_reason=row.maintenance_reason, profile=row.profile, rack=row.rack,
            position=row.position, facts=json.loads(row.facts), last_error=row.last_error,
            checkpoint=tuple(json.loads(row.checkpoint)), version=row.version,
            history_seq=row.history_seq, bmc=bmc, created_at=row.created_at,
            updated_at=row.updated_at, power_state=row.power_state, bmc_mac=row.bmc_mac,
        )


def _get_row(s: Session, node_id: str) -> NodeRow:
    row = s.get(NodeRow, node_id)
    if row is None:
        raise NotFound("node", node_id)
    return row


def _find_row(s: Session, key: str) -> NodeRow:
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


def _filtered(query: Any, flt: NodeFilter) -> Any:
    if flt.state is not None:
        query = query.where(col(NodeRow.state) == flt.state)
    if flt.rack is not None:
        query = query.where(col(NodeRow.rack) == flt.rack)
    if flt.profile is not None:
        query = query.where(col(NodeRow.profile) == flt.profile)
    if flt.maintenance is not None:
        query = query.where(col(NodeRow.maintenance) == flt.maintenance)
    if flt.query:
        pattern = f"%{_escape_like(flt.query)}%"
        mac_match = select(NodeMacRow.node_id).where(
            col(NodeMacRow.mac).like(f"%{_escape_like(flt.query.lower())}%", escape="\\"))
        query = query.where(or_(
            col(NodeRow.hostname).like(pattern, escape="\\"),
            col(NodeRow.serial).like(pattern, escape="\\"),
            col(NodeRow.id).in_(mac_match),
        ))
    return query


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _macs_for(s: Session, node_ids: list[str]) -> dict[str, tuple[str, ...]]:
    if not node_ids:
        return {}
    found: dict[str, list[str]] = {}
    rows = s.exec(select(NodeMacRow).where(col(NodeMacRow.node_id).in_(node_ids))
                  .order_by(col(NodeMacRow.mac))).all()
    for mac_row in rows:
        found.setdefault(mac_row.node_id, []).append(mac_row.mac)
    return {node_id: tuple(macs) for node_id, macs in found.items()}


def _commit_unique(s: Session, kind: str, *, flush_only: bool = False) -> None:
    try:
        if flush_only:
            s.flush()
        else:
            s.commit()
    except IntegrityError as exc:
        s.rollback()
        raise Conflict(f"{kind} conflicts with an existing one: {_which_unique(exc)}") from exc
    except DataError as exc:  # PostgreSQL: a value longer than its column, say
        s.rollback()
        raise InvalidRequest(f"{kind} has a value the database refuses: "
                             f"{str(exc.orig).splitlines()[0]}") from exc


def _which_unique(exc: IntegrityError) -> str:
    text = str(exc.orig).lower()
    for field in ("hostname", "serial", "mac", "name"):
        if field in text:
            return f"{field} already in use"
    return "a unique field is already in use"


def _to_entry(row: TransitionRow) -> HistoryEntry:
    return HistoryEntry(node_id=NodeId(row.node_id), seq=row.seq, event=row.event,
                        from_state=row.from_state, to_state=row.to_state, actor=row.actor,
                        reason=row.reason, at=row.created_at, instance=row.instance,
                        fence=row.fence)
