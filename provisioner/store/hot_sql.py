"""The statements of a node's hot store calls, built once with bound parameters.

A node's lifecycle makes ~55 store calls; building a statement (``update(...).where(...)``)
and computing its cache key cost more CPU than SQLite takes to run it (a node read: 178 µs
built per call, 47 µs prebuilt; an UPDATE: 76 µs and 14 µs). A statement built once keeps
its cache key. The ``UPDATE``s name no SET columns: they come from the keys of the
parameters each call passes (only columns; the WHERE's parameters start with ``b_``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    Exists,
    Insert,
    Select,
    Table,
    Update,
    bindparam,
    insert,
    select,
    update,
)

from provisioner.domain import Node
from provisioner.errors import NotFound
from provisioner.store.models import NodeLeaseRow
from provisioner.store.node_rows import MAC, NODE, TRANSITION, to_node

LEASE: Table = NodeLeaseRow.__table__  # type: ignore[attr-defined]

#: a node joined to its MACs (a row per MAC; one with none for a node without)
READ_NODE: Select[Any] = select(NODE, MAC.c.mac).outerjoin(
    MAC, MAC.c.node_id == NODE.c.id).where(NODE.c.id == bindparam("b_id")).order_by(MAC.c.mac)

#: the node's row, locked for the read-modify-write of its facts (PostgreSQL)
LOCK_NODE: Select[Any] = select(NODE).where(NODE.c.id == bindparam("b_id")).with_for_update()

#: we hold the node's lease with this fence, the lease row locked ``FOR KEY SHARE``
#: (PostgreSQL) to the end of the transaction, so no claim (``FOR UPDATE``) slips in before
#: the commit. Not ``FOR SHARE``: that also blocks a renewal's ``UPDATE`` of the expiry, and a
#: group commit share-locking several nodes' rows while a renewal updated the same rows in
#: another order was PostgreSQL's ``deadlock detected``: the renewal failed, the leases lapsed
#: and another daemon took live steps over
HOLDS: Exists = select(LEASE.c.fence).where(
    LEASE.c.node_id == bindparam("b_id"), LEASE.c.owner == bindparam("b_owner"),
    LEASE.c.fence == bindparam("b_fence")).with_for_update(read=True, key_share=True).exists()

#: the same, read: a fenced write that matched no row asks whether it lost its lease
HELD: Select[Any] = select(LEASE.c.fence).where(
    LEASE.c.node_id == bindparam("b_id"), LEASE.c.owner == bindparam("b_owner"),
    LEASE.c.fence == bindparam("b_fence")).with_for_update(read=True, key_share=True)

#: a transition's compare-and-set on the version, unfenced and fenced
CAS_VERSION: Update = update(NODE).where(NODE.c.id == bindparam("b_id"),
                                         NODE.c.version == bindparam("b_version"))
CAS_VERSION_FENCED: Update = CAS_VERSION.where(HOLDS)

#: a checkpoint's write, conditional on the state the step runs for
IN_STATE: Update = update(NODE).where(NODE.c.id == bindparam("b_id"),
                                      NODE.c.state == bindparam("b_state"))
IN_STATE_FENCED: Update = IN_STATE.where(HOLDS)

#: one node's row, unconditionally (its facts, under LOCK_NODE)
BY_ID: Update = update(NODE).where(NODE.c.id == bindparam("b_id"))

HISTORY_ROW: Insert = insert(TRANSITION)

#: an enrolment's rows: the node, its MACs, its lease row (free)
NEW_NODE: Insert = insert(NODE)
NEW_MAC: Insert = insert(MAC)
NEW_LEASE: Insert = insert(LEASE)

#: a node's lease row, locked to claim it (a forced claim waits for a write in progress)
LEASE_ROW: Select[Any] = select(LEASE.c.owner, LEASE.c.fence, LEASE.c.expires_at).where(
    LEASE.c.node_id == bindparam("b_id"))
LEASE_TO_CLAIM: Select[Any] = LEASE_ROW.with_for_update(skip_locked=True)
LEASE_TO_FORCE: Select[Any] = LEASE_ROW.with_for_update()

#: the lease taken: owner, fence and expires_at from the parameters
TAKE_LEASE: Update = update(LEASE).where(LEASE.c.node_id == bindparam("b_id"))

#: the BMC login of one node
CREDENTIALS: Select[Any] = select(NODE.c.bmc_username, NODE.c.bmc_password_enc).where(
    NODE.c.id == bindparam("b_id"))

#: the lease freed when a step ends, if still ours with this fence
RELEASE: Update = update(LEASE).where(
    LEASE.c.node_id == bindparam("b_id"), LEASE.c.owner == bindparam("b_owner"),
    LEASE.c.fence == bindparam("b_fence")).values(owner=None, expires_at=None)


def read_node(conn: Connection, node_id: str) -> Node:
    """One node, read in one statement as plain rows: what ``NodeReads.get`` returns, at a
    fraction of the ORM's CPU (a node's lifecycle reads it ~15 times)."""
    rows = conn.execute(READ_NODE, {"b_id": node_id}).all()
    if not rows:
        raise NotFound("node", node_id)
    return to_node(conn, rows[0], tuple(row.mac for row in rows if row.mac is not None))
