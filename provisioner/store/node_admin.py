"""An operator's edits of node records: metadata edits, deletion of retired nodes and the
replacement of a retired chassis (issue 30). Every change is a compare-and-set on
``node.version`` with its history rows in the same transaction."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from sqlalchemy import delete, update
from sqlmodel import Session, col, select

from provisioner.domain import HistoryEntry, Node, NodeState
from provisioner.errors import Conflict, NodeBusy
from provisioner.store import notify
from provisioner.store.models import (
    ApiTokenRow,
    NodeLeaseRow,
    NodeMacRow,
    NodeRow,
    TransitionRow,
    utcnow,
)
from provisioner.store.node_reads import NodeReads
from provisioner.store.node_rows import commit_unique, get_row, to_entry, to_node

#: the fields ``edit`` may change
EDITABLE: Final = ("hostname", "rack", "position", "profile")
EDIT_EVENT: Final = "edit"
REPLACED_BY_EVENT: Final = "replaced_by"
REPLACES_EVENT: Final = "replaces"


def _shown(value: str | None) -> str:
    return "(none)" if value is None else repr(value)


class NodeAdmin(NodeReads):
    """Writes an operator makes to node records, outside the lifecycle."""

    def _bump(self, s: Session, node: Node, rows: int) -> None:
        """CAS ``node`` forward by one version and ``rows`` history rows."""
        result = s.execute(
            update(NodeRow)
            .where(col(NodeRow.id) == node.id, col(NodeRow.version) == node.version)
            .values(version=node.version + 1, history_seq=node.history_seq + rows,
                    updated_at=utcnow()))
        if result.rowcount != 1:  # type: ignore[attr-defined]
            s.rollback()
            raise NodeBusy(f"node {node.id} changed concurrently; retry")

    def _row(self, s: Session, node: Node, seq: int, event: str, actor: str,
             reason: str) -> None:
        s.add(TransitionRow(node_id=node.id, seq=seq, event=event, from_state=str(node.state),
                            to_state=str(node.state), actor=actor, reason=reason,
                            instance=self.instance))

    async def edit(self, node: Node, changes: Mapping[str, str | None], *, actor: str,
                   reason: str = "") -> Node:
        """Set the fields in ``changes`` (None clears one); one history row per field that
        changes, naming its old and new value. Unchanged fields write nothing."""
        unknown = set(changes) - set(EDITABLE)
        if unknown:
            raise ValueError(f"not editable: {', '.join(sorted(unknown))}")
        changed = {name: value for name, value in changes.items()
                   if getattr(node, name) != value}
        if not changed:
            return node

        def work(s: Session) -> Node:
            self._bump(s, node, len(changed))
            row = get_row(s, node.id)
            for name, value in changed.items():
                setattr(row, name, value)
            s.add(row)
            for offset, (name, value) in enumerate(sorted(changed.items()), start=1):
                text = f"{name} {_shown(getattr(node, name))} -> {_shown(value)}"
                self._row(s, node, node.history_seq + offset, EDIT_EVENT, actor,
                          f"{text}: {reason}" if reason else text)
            commit_unique(s, "node")  # a hostname in use: Conflict, nothing written
            return to_node(s, row)

        return await self._run(work)

    async def delete(self, node: Node) -> list[HistoryEntry]:
        """Delete a retired node with its MACs, tokens and history; returns the history it
        had (the caller exports it). Conflict unless the node is still retired at
        ``node.version``."""

        def work(s: Session) -> list[HistoryEntry]:
            row = get_row(s, node.id)
            if row.version != node.version or row.state != str(NodeState.RETIRED):
                s.rollback()
                raise Conflict(f"node {node.id} changed concurrently (state {row.state}); "
                               "retry")
            history = [to_entry(r) for r in s.exec(
                select(TransitionRow).where(col(TransitionRow.node_id) == node.id)
                .order_by(col(TransitionRow.seq))).all()]
            for table in (NodeMacRow, ApiTokenRow, TransitionRow, NodeLeaseRow):
                s.execute(delete(table).where(col(table.node_id) == node.id))
            s.execute(delete(NodeRow).where(col(NodeRow.id) == node.id))
            notify.send(s, self.instance, node.id, node.macs)
            s.commit()
            return history

        return await self._run(work)

    async def replace(self, old: Node, new: Node, *, actor: str,
                      reason: str = "") -> tuple[Node, Node]:
        """``new`` takes the hostname, rack and position (and the profile, if it has none)
        of the retired ``old``; ``old`` gives up its hostname, serial and MACs (kept in its
        facts under ``replaced_by``). A history row on each names the other."""

        def work(s: Session) -> tuple[Node, Node]:
            self._bump(s, old, 1)
            self._bump(s, new, 1)
            facts = json.loads(get_row(s, old.id).facts)
            facts["replaced_by"] = {"node": new.id, "hostname": old.hostname,
                                    "serial": old.serial, "macs": list(old.macs)}
            s.execute(delete(NodeMacRow).where(col(NodeMacRow.node_id) == old.id))
            s.execute(update(NodeRow).where(col(NodeRow.id) == old.id).values(
                hostname=None, serial=None, facts=json.dumps(facts, sort_keys=True)))
            s.flush()  # the hostname is free before the new node takes it
            values = {"hostname": old.hostname, "rack": old.rack, "position": old.position}
            if new.profile is None:
                values["profile"] = old.profile
            s.execute(update(NodeRow).where(col(NodeRow.id) == new.id).values(**values))
            name = old.hostname or old.id
            why = f": {reason}" if reason else ""
            self._row(s, old, old.history_seq + 1, REPLACED_BY_EVENT, actor,
                      f"replaced by node {new.id} (serial {new.serial or '-'}); freed "
                      f"hostname {_shown(old.hostname)}, serial {_shown(old.serial)}, "
                      f"MACs {', '.join(old.macs) or '-'}{why}")
            self._row(s, new, new.history_seq + 1, REPLACES_EVENT, actor,
                      f"replaces retired node {old.id} ({name}, serial {old.serial or '-'}); "
                      f"took hostname {_shown(old.hostname)}, rack {_shown(old.rack)}, "
                      f"position {_shown(old.position)}{why}")
            commit_unique(s, "node")
            notify.send(s, self.instance, old.id, old.macs)
            notify.send(s, self.instance, new.id, new.macs)
            s.commit()
            return to_node(s, get_row(s, old.id)), to_node(s, get_row(s, new.id))

        return await self._run(work)
