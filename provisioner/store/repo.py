"""NodeRepo: the only SQL in the daemon. Blocking work runs in the bounded ``store`` pool.

State changes are compare-and-set on ``node.version`` and write their history row in the
same transaction, so a crash can never leave a state without its history or vice versa.
Reads are ``NodeReads`` (``store/node_reads.py``); row mapping and shared query pieces are
``store/node_rows.py``.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, delete, update
from sqlalchemy import select as sa_select
from sqlalchemy.exc import DataError, IntegrityError
from sqlmodel import Session, col

from provisioner.domain import (
    BmcCredentials,
    BmcEndpoint,
    BmcTarget,
    NewNode,
    Node,
    NodeState,
)
from provisioner.errors import Fenced, NodeBusy, NotFound
from provisioner.ids import NodeId, new_node_id, normalize_mac
from provisioner.store import hot_sql as sql
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
from provisioner.store.node_admin import NodeAdmin
from provisioner.store.node_rows import (
    apply_bmc,
    commit_unique,
    get_row,
    refused,
    to_node,
)

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
    bmc_password: str | None = field(default=None, repr=False)
    bmc_mac: str | None = None
    keep_bmc_password: bool = False
    """Keep the stored password when ``bmc`` moves the endpoint (zero-touch linking, to an
    address it trusts); by default a new address drops it: a password is never sent to an
    address other than the one it was entered for."""


class NodeRepo(NodeAdmin):
    """Reads (``NodeReads``), an operator's edits (``NodeAdmin``) and every write of node
    rows."""

    def _check_fence(self, conn: Connection, node_id: str, fence: int | None) -> None:
        """Fenced unless we still hold the node's lease with ``fence`` (a fenced write
        that matched no row asks: a lost lease, or a raced write?). Raising rolls the
        transaction back."""
        if fence is None:
            return
        held = conn.execute(sql.HELD, self._lease_key(node_id, fence)).first()
        if held is None:
            raise Fenced(f"node {node_id}: write refused, instance {self.instance} no longer "
                         f"holds its lease (fence {fence})")

    def _lease_key(self, node_id: str, fence: int) -> dict[str, Any]:
        """The parameters of ``sql.HOLDS``, ``HELD`` and ``RELEASE``: our lease on the node."""
        return {"b_id": node_id, "b_owner": self.instance, "b_fence": fence}

    async def _fenced_write(self, node_id: str, fence: int | None,
                            work: Callable[[Connection], Node]) -> Node:
        try:
            return await self._run_batched(work)
        except Fenced:  # logged here, once (a group commit that failed runs its calls again)
            log.warning("node %s: write refused by fencing: instance %s lost its lease "
                        "(fence %d)", node_id, self.instance, fence)
            raise

    def _release(self, conn: Connection, node_id: str, fence: int | None) -> None:
        if fence is not None:
            conn.execute(sql.RELEASE, self._lease_key(node_id, fence))

    # -- writes -----------------------------------------------------------------------------

    async def create(self, new: NewNode, *, actor: str, reason: str = "") -> Node:
        """The node, its MACs, its (free) lease row and its first history row, in SQL
        expressions through the group commit: a boot storm enrols a thousand discovered
        nodes in a few seconds, and one ORM session and commit each held the store's
        thread (SQLite: the one the DHCP leases and the boot tokens wait for) for a sixth
        of the storm (docs/performance.md, "Boot storm")."""
        row = NodeRow(id=new_node_id(), state=str(new.state), hostname=new.hostname,
                      serial=new.serial, profile=new.profile, rack=new.rack,
                      position=new.position, version=1, history_seq=1)
        apply_bmc(row, new.bmc, new.bmc_password, self._box)
        values = row.model_dump()
        macs = sorted(normalize_mac(mac) for mac in new.macs)

        def work(conn: Connection) -> Node:
            conn.execute(sql.NEW_NODE, values)  # the node row first: the FKs need it
            if macs:
                conn.execute(sql.NEW_MAC, [{"mac": mac, "node_id": row.id} for mac in macs])
            conn.execute(sql.NEW_LEASE, {"node_id": row.id, "owner": None, "fence": 0,
                                         "expires_at": None})
            conn.execute(sql.HISTORY_ROW, {
                "node_id": row.id, "seq": 1, "event": "enroll", "from_state": "",
                "to_state": str(new.state), "actor": actor, "reason": reason,
                "created_at": row.created_at, "instance": self.instance, "fence": None})
            # in the transaction (a unique conflict rolls it back, notice and all): other
            # daemons drop these MACs from their negative caches once it commits
            notify.send(conn, self.instance, row.id, macs)
            return to_node(conn, row, macs)  # the MACs as written: no read back

        try:
            return await self._run_batched(work)
        except (IntegrityError, DataError) as exc:
            raise refused("node", exc) from exc

    async def update_meta(self, node_id: str, change: NodeChange) -> Node:
        def work(s: Session) -> Node:
            row = get_row(s, node_id)
            for name in ("hostname", "serial", "profile", "rack", "position"):
                value = getattr(change, name)
                if value is not None:
                    setattr(row, name, value)
            if change.bmc is not None:
                apply_bmc(row, change.bmc, change.bmc_password, self._box,
                          keep_password=change.keep_bmc_password)
            if change.bmc_mac is not None:
                row.bmc_mac = change.bmc_mac
            row.updated_at = utcnow()
            s.add(row)
            commit_unique(s, "node")
            return to_node(s, row)

        return await self._run(work)

    async def edit_recorded(self, node: Node, change: NodeChange, *, event: str, actor: str,
                            reason: str, add_macs: Sequence[str] = (),
                            remove_macs: Sequence[str] = ()) -> Node:
        """Change a node's metadata and MACs with one history row (``event``, the state
        unchanged), compare-and-set on ``node.version``: one transaction, so no change is
        ever without its row. The caller holds the conductor's node lock."""
        add = sorted({normalize_mac(mac) for mac in add_macs})
        remove = sorted({normalize_mac(mac) for mac in remove_macs} - set(add))

        def work(s: Session) -> Node:
            row = get_row(s, node.id)
            if row.version != node.version:
                s.rollback()
                raise NodeBusy(f"node {node.id} changed concurrently; retry")
            for name in ("hostname", "serial", "profile", "rack", "position"):
                value = getattr(change, name)
                if value is not None:
                    setattr(row, name, value)
            if change.bmc is not None:
                apply_bmc(row, change.bmc, change.bmc_password, self._box,
                          keep_password=change.keep_bmc_password)
            if remove:
                s.execute(delete(NodeMacRow).where(col(NodeMacRow.node_id) == node.id,
                                                   col(NodeMacRow.mac).in_(remove)))
            for mac in add:
                s.add(NodeMacRow(mac=mac, node_id=node.id))
            row.version += 1
            row.history_seq += 1
            row.updated_at = utcnow()
            s.add(row)
            s.add(TransitionRow(node_id=node.id, seq=row.history_seq, event=event,
                                from_state=row.state, to_state=row.state, actor=actor,
                                reason=reason, created_at=row.updated_at,
                                instance=self.instance))
            commit_unique(s, "node")
            notify.send(s, self.instance, node.id, (*node.macs, *add))
            s.commit()
            return to_node(s, get_row(s, node.id))

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
        facts: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> Node:
        """CAS the node from ``node.version`` to ``to_state`` and append one history row.
        ``fence``: only while we hold the node's lease with it (else Fenced); ``release``:
        free that lease in the same transaction (the step ended); ``facts``: also write
        ``facts(stored facts)``, read under the row's lock (the record a transition opens,
        such as a repair ladder's: written only if the transition is)."""

        def work(conn: Connection) -> Node:
            now = utcnow()
            merged: dict[str, Any] | None = None
            if facts is not None:
                stored = conn.execute(sql.LOCK_NODE, {"b_id": node.id}).first()
                merged = facts(json.loads(stored.facts) if stored is not None else {})
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
            if merged is not None:
                values["facts"] = json.dumps(merged, sort_keys=True)
            # a fenced write checks its lease in its own UPDATE (a statement less); when
            # no row matched, _check_fence tells a lost lease from a raced write
            key = {"b_id": node.id, "b_version": node.version}
            result = conn.execute(sql.CAS_VERSION, values | key) if fence is None else \
                conn.execute(sql.CAS_VERSION_FENCED, values | key | self._lease_key(node.id,
                                                                                   fence))
            if result.rowcount != 1:
                self._check_fence(conn, node.id, fence)  # a lost lease: Fenced, as before
                raise NodeBusy(f"node {node.id} changed concurrently; retry")
            conn.execute(sql.HISTORY_ROW, {
                "node_id": node.id, "seq": node.history_seq + 1, "event": event,
                "from_state": str(node.state), "to_state": str(to_state), "actor": actor,
                "reason": reason, "created_at": now, "instance": self.instance,
                "fence": fence})
            if release:
                self._release(conn, node.id, fence)
            notify.send(conn, self.instance, node.id, node.macs)
            # The CAS proved nobody else wrote: the new node is the old one plus our values.
            changed: dict[str, Any] = {"state": to_state, "version": node.version + 1,
                                       "history_seq": node.history_seq + 1, "updated_at": now}
            if last_error is not None:
                changed["last_error"] = last_error
            if reset_checkpoint:
                changed["checkpoint"] = ()
            if maintenance is not None:
                changed["maintenance"], changed["maintenance_reason"] = maintenance
            if merged is not None:
                changed["facts"] = merged
            return dataclasses.replace(node, **changed)

        return await self._fenced_write(node.id, fence, work)

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
            return to_node(s, get_row(s, owner.id))

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

        def work(conn: Connection) -> Node:
            key = {"b_id": node.id, "b_state": str(node.state), "updated_at": utcnow()}
            result = conn.execute(sql.IN_STATE, values | key) if fence is None else \
                conn.execute(sql.IN_STATE_FENCED, values | key | self._lease_key(node.id,
                                                                                 fence))
            if result.rowcount != 1:
                self._check_fence(conn, node.id, fence)  # a lost lease: Fenced, as before
                raise NodeBusy(f"node {node.id} left {node.state} while its step ran")
            if power_state is not None:
                return dataclasses.replace(node, checkpoint=tuple(checkpoint),
                                           power_state=power_state)
            return dataclasses.replace(node, checkpoint=tuple(checkpoint))

        return await self._fenced_write(node.id, fence, work)

    async def merge_facts(self, node_id: str, facts: dict[str, Any], *,
                          fence: int | None = None) -> Node:
        return await self.update_fact(node_id, lambda found: found | facts, fence=fence)

    async def update_fact(self, node_id: str,
                          change: Callable[[dict[str, Any]], dict[str, Any]], *,
                          fence: int | None = None) -> Node:
        """Write ``change(facts)`` as the node's facts, read and written under the row's
        lock (``FOR UPDATE``): another daemon's merge between our read and our write would
        be lost (a repair record's rung result overwritten by a stale copy). ``fence``:
        only while we hold the node's lease with it (a step's write; else Fenced)."""
        def work(conn: Connection) -> Node:
            self._check_fence(conn, node_id, fence)
            row = conn.execute(sql.LOCK_NODE, {"b_id": node_id}).first()
            if row is None:
                raise NotFound("node", node_id)
            written = {"facts": json.dumps(change(json.loads(row.facts)), sort_keys=True),
                       "updated_at": utcnow()}
            conn.execute(sql.BY_ID, written | {"b_id": node_id})
            return to_node(conn, SimpleNamespace(**(dict(row._mapping) | written)))

        return await self._fenced_write(node_id, fence, work)

    async def bmc_targets(self) -> builtins.list[BmcTarget]:
        """Every node with a BMC endpoint, its credentials and last power state, in one read
        of only those columns: the power-state sync reads them all every period (a query per
        node, or every node's facts parsed, cost a fleet at rest more than its BMC reads)."""
        def work(s: Session) -> builtins.list[BmcTarget]:
            c = NodeRow.__table__.c  # type: ignore[attr-defined]  # plain rows: no ORM objects
            rows = s.execute(sa_select(
                c.id, c.state, c.bmc_driver, c.bmc_address, c.bmc_port, c.bmc_username,
                c.bmc_password_enc, c.power_state)
                .where(c.bmc_driver.is_not(None)).order_by(c.id)).all()
            return [BmcTarget(
                id=NodeId(node_id), state=NodeState(state), power_state=power,
                bmc=BmcEndpoint(driver=driver, address=address or "", port=port,
                                username=username, password_set=sealed is not None),
                credentials=BmcCredentials(
                    username=username,
                    password=None if sealed is None else self._box.decrypt(sealed)))
                for node_id, state, driver, address, port, username, sealed, power in rows]

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
            return to_node(s, get_row(s, node.id))

        return await self._run(work)
