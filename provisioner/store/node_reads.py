"""The node repository's reads: one node, lists and pages, stamps for pollers, counts,
history, BMC credentials (decrypted only here)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from sqlalchemy import Connection, Engine, cast, func, or_
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Session, col, select

from provisioner.domain import (
    BmcCredentials,
    FleetEvent,
    HistoryEntry,
    Node,
    NodeFilter,
    NodeState,
    NodeSummary,
)
from provisioner.errors import NotFound
from provisioner.ids import NodeId
from provisioner.store.history import AuditQuery, audit, prune_batch, with_former_hostnames
from provisioner.store.hot_sql import CREDENTIALS, read_node
from provisioner.store.models import NodeRow, TransitionRow
from provisioner.store.node_rows import (
    escape_like,
    filtered,
    find_row,
    get_row,
    macs_for,
    to_entry,
    to_node,
)
from provisioner.store.secretbox import SecretBox
from provisioner.store.session import SessionRepo


class NodeReads(SessionRepo):
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor, box: SecretBox, *,
                 instance: str | None = None) -> None:
        """``instance``: this daemon's id, written on every history row and checked (with
        the fencing number) by fenced writes."""
        super().__init__(engine, pool)
        self._box = box
        self.instance = instance

    # -- reads ------------------------------------------------------------------------------

    async def get(self, node_id: str) -> Node:
        return await self._run_batched(lambda conn: read_node(conn, node_id))

    async def find(self, key: str) -> Node:
        """Look a node up by id, hostname, serial or MAC."""
        return await self._run(lambda s: to_node(s, find_row(s, key)))

    async def find_by_serial(self, serial: str) -> Node | None:
        def work(s: Session) -> Node | None:
            row = s.exec(select(NodeRow).where(col(NodeRow.serial) == serial)).first()
            return None if row is None else to_node(s, row)

        return await self._run(work)

    async def list(
        self, flt: NodeFilter, *, limit: int, offset: int
    ) -> tuple[builtins.list[Node], int]:
        def work(s: Session) -> tuple[builtins.list[Node], int]:
            query = filtered(select(NodeRow), flt)
            total = s.exec(filtered(select(func.count()).select_from(NodeRow), flt)).one()
            rows = s.exec(query.order_by(col(NodeRow.created_at), col(NodeRow.id))
                          .offset(offset).limit(limit)).all()
            macs = macs_for(s, [r.id for r in rows])
            return [to_node(s, r, macs.get(r.id, ())) for r in rows], int(total)

        return await self._run(work)

    async def in_states(self, states: Iterable[NodeState]) -> builtins.list[Node]:
        wanted = [str(st) for st in states]

        def work(s: Session) -> builtins.list[Node]:
            rows = s.exec(select(NodeRow).where(col(NodeRow.state).in_(wanted))).all()
            macs = macs_for(s, [r.id for r in rows])
            return [to_node(s, r, macs.get(r.id, ())) for r in rows]

        return await self._run(work)

    async def with_facts_keys(self, states: Iterable[NodeState], keys: Sequence[str]
                              ) -> builtins.list[Node]:
        """The nodes in ``states`` with, of their facts, only ``keys`` (each taken out of
        the JSON by the database: the fleet's firmware gauge reads every node on each
        /metrics scrape, where parsing each node's whole facts cost most of the scrape);
        no MACs."""
        wanted = [str(st) for st in states]

        def work(s: Session) -> builtins.list[Node]:
            table = NodeRow.__table__  # type: ignore[attr-defined]  # plain rows, no ORM
            postgres = s.get_bind().dialect.name == "postgresql"
            parts = [(cast(table.c.facts, JSONB)[key].astext if postgres else
                      func.json_extract(table.c.facts, f'$."{key}"')).label(f"facts_{i}")
                     for i, key in enumerate(keys)]
            rows = s.execute(sa_select(*(c for c in table.c if c.name != "facts"), *parts)
                             .where(table.c.state.in_(wanted))).all()
            return [to_node(s, row, (), facts={
                k: v for i, key in enumerate(keys)
                for k, v in _one_key(key, getattr(row, f"facts_{i}")).items()})
                for row in rows]

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

    async def serials(self, among: Iterable[str] | None = None) -> frozenset[str]:
        """The serials enrolled (``among``: only which of these are, by the index)."""
        def work(s: Session) -> frozenset[str]:
            query = select(NodeRow.serial).where(col(NodeRow.serial).is_not(None))
            if among is not None:
                query = query.where(col(NodeRow.serial).in_(builtins.list(among)))
            return frozenset(serial for serial in s.exec(query).all() if serial is not None)

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
        needle = "%" + escape_like('"clique": ' + json.dumps(clique)) + "%"

        def work(s: Session) -> builtins.list[Node]:
            rows = s.exec(select(NodeRow).where(
                col(NodeRow.facts).like(needle, escape="\\"))).all()
            macs = macs_for(s, [r.id for r in rows])
            return [to_node(s, r, macs.get(r.id, ())) for r in rows]

        return await self._run(work)

    async def clique_stamps(self, states: Iterable[NodeState],
                            ) -> dict[str, tuple[str, datetime]]:
        """``stamps`` of the nodes in ``states`` whose facts name some NVLink clique (the
        same text match as ``naming_clique``): the nodes a view of the domains must read."""
        wanted = [str(st) for st in states]
        needle = "%" + escape_like('"clique": "') + "%"

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
            macs = macs_for(s, [r.id for r in rows])
            return [to_node(s, r, macs.get(r.id, ())) for r in rows]

        return await self._run(work)

    async def page(self, flt: NodeFilter, *, limit: int, offset: int,
                   ) -> tuple[builtins.list[NodeSummary], int]:
        """``list`` without facts or MACs (a node's facts may be megabytes): the console's
        node table."""
        def work(s: Session) -> tuple[builtins.list[NodeSummary], int]:
            c = NodeRow.__table__.c  # type: ignore[attr-defined]
            query = filtered(sa_select(
                c.id, c.hostname, c.state, c.maintenance, c.rack, c.position, c.profile,
                c.power_state, c.last_error, c.maintenance_reason), flt)
            total = s.exec(filtered(select(func.count()).select_from(NodeRow), flt)).one()
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
            get_row(s, node_id)
            rows = s.exec(select(TransitionRow).where(TransitionRow.node_id == node_id)
                          .order_by(col(TransitionRow.seq))).all()
            return [to_entry(r) for r in rows]

        return await self._run(work)

    async def last_event_id(self) -> int:
        """The newest history row's fleet-wide id (0 when there is none)."""
        def work(s: Session) -> int:
            return int(s.exec(select(func.max(TransitionRow.id))).one() or 0)

        return await self._run(work)

    async def events(self, *, after: int = 0, also: Iterable[int] = (), limit: int = 500,
                     node: str | None = None, newest: bool = False) -> builtins.list[FleetEvent]:
        """History rows of every node with an id above ``after`` (or in ``also``: ids a
        slower transaction may commit late), oldest first; ``newest``: the last ``limit``
        of them. ``node``: one node's, by id or hostname."""
        def work(s: Session) -> builtins.list[FleetEvent]:
            # plain columns: never a node's facts, which a batch of rows would load again
            transitions = TransitionRow.__table__  # type: ignore[attr-defined]
            nodes = NodeRow.__table__  # type: ignore[attr-defined]
            t, n = transitions.c, nodes.c
            wanted = t.id > after
            extra = builtins.list(also)
            if extra:
                wanted = or_(wanted, t.id.in_(extra))
            query = sa_select(t.id, t.node_id, t.seq, t.event, t.from_state, t.to_state,
                              t.actor, t.reason, t.created_at, t.instance, t.fence,
                              n.hostname, n.maintenance, n.maintenance_reason, n.last_error
                              ).join_from(transitions, nodes, n.id == t.node_id).where(wanted)
            if node is not None:
                query = query.where(or_(n.id == node, n.hostname == node))
            query = query.order_by(t.id.desc() if newest else t.id).limit(limit)
            found = [FleetEvent(int(r.id), HistoryEntry(
                node_id=NodeId(r.node_id), seq=r.seq, event=r.event, from_state=r.from_state,
                to_state=r.to_state, actor=r.actor, reason=r.reason, at=r.created_at,
                instance=r.instance, fence=r.fence), r.hostname, bool(r.maintenance),
                r.maintenance_reason or "", r.last_error or "")
                for r in s.connection().execute(query).all()]
            found = with_former_hostnames(s.connection(), found)
            return found[::-1] if newest else found

        return await self._run(work)

    async def audit(self, query: AuditQuery) -> builtins.list[FleetEvent]:
        """The fleet's history rows matching ``query`` (``store.history``)."""
        return await self._run(lambda s: audit(s.connection(), query))

    async def prune_history(self, before: datetime) -> int:
        """Delete the history rows written before ``before``, except each node's last one,
        in batches (one transaction each); how many went."""
        def work(s: Session) -> int:
            gone = prune_batch(s.connection(), before)
            s.commit()
            return gone

        total = 0
        while (gone := await self._run(work)) > 0:
            total += gone
        return total

    async def credentials(self, node_id: str) -> BmcCredentials:
        def work(conn: Connection) -> BmcCredentials:
            row = conn.execute(CREDENTIALS, {"b_id": node_id}).first()
            if row is None:
                raise NotFound("node", node_id)
            password = None
            if row.bmc_password_enc is not None:
                password = self._box.decrypt(row.bmc_password_enc)
            return BmcCredentials(username=row.bmc_username, password=password)

        return await self._run_batched(work)


def _one_key(key: str, raw: object) -> dict[str, object]:
    """``{key: value}`` from the database's extract (JSON text of an object or array; a
    scalar as SQLite and ``->>`` give it), ``{}`` where the facts have no ``key``."""
    if raw is None:
        return {}
    try:
        return {key: json.loads(raw) if isinstance(raw, str | bytes) else raw}
    except ValueError:
        return {key: raw}
