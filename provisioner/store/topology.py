"""TopologyRepo: what the live topology reads. The latest ``ibnetdiscover`` scan of each
fabric (table ``fabric_scan``, one row per fabric: a new scan replaces the old one), and the
member nodes' versions and facts, read in two steps so that a recompute loads the (large)
facts only of nodes that changed since the last one. Blocking work runs in the ``store`` pool.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from sqlmodel import Session, col, select

from provisioner.errors import InvalidRequest
from provisioner.store.models import FabricScanRow, NodeRow, utcnow
from provisioner.store.session import SessionRepo

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FabricScan:
    name: str
    text: str
    sha256: str
    reporter_node_id: str | None
    received_at: datetime


@dataclass(frozen=True, slots=True)
class MemberRow:
    node_id: str
    hostname: str
    version: str
    """The node's version: bumped by every transition and history row (a facts report
    outside inspection records ``facts_reported``), not by checkpoints."""


class TopologyRepo(SessionRepo):
    async def save(self, name: str, text: str, *, reporter_node_id: str | None,
                   max_per_reporter: int | None = None) -> FabricScan:
        """Store ``text`` as fabric ``name``'s scan (replacing any earlier one).
        ``max_per_reporter``: InvalidRequest when the reporter already holds that many
        other fabrics' scans (a node cannot fill the table with made-up fabric names)."""
        digest = hashlib.sha256(text.encode()).hexdigest()

        def work(s: Session) -> FabricScan:
            reporter = reporter_node_id
            if reporter is not None and s.get(NodeRow, reporter) is None:
                reporter = None  # the node went away meanwhile: keep the scan anyway
            if reporter is not None and max_per_reporter is not None:
                held = s.exec(select(FabricScanRow.name).where(
                    FabricScanRow.reporter_node_id == reporter,
                    FabricScanRow.name != name)).all()
                if len(held) >= max_per_reporter:
                    raise InvalidRequest(
                        f"fabric {name!r}: node {reporter} already reported "
                        f"{len(held)} other fabrics ({', '.join(sorted(held))}), at most "
                        f"{max_per_reporter}")
            row = s.get(FabricScanRow, name)
            if row is None:
                row = FabricScanRow(name=name, text=text, sha256=digest)
            row.text, row.sha256 = text, digest
            row.reporter_node_id, row.received_at = reporter, utcnow()
            s.add(row)
            s.commit()
            return _to_scan(row)

        return await self._run(work)

    async def all(self) -> list[FabricScan]:
        def work(s: Session) -> list[FabricScan]:
            rows = s.exec(select(FabricScanRow).order_by(col(FabricScanRow.name))).all()
            return [_to_scan(row) for row in rows]

        return await self._run(work)

    async def infos(self) -> list[FabricScan]:
        """Every fabric's scan without its text (``text`` is "")."""

        def work(s: Session) -> list[FabricScan]:
            rows = s.exec(select(FabricScanRow.name, FabricScanRow.sha256,
                                 FabricScanRow.reporter_node_id, FabricScanRow.received_at)
                          .order_by(col(FabricScanRow.name))).all()
            return [FabricScan(name, "", digest, reporter, _aware(moment))
                    for name, digest, reporter, moment in rows]

        return await self._run(work)

    async def digests(self) -> dict[str, str]:
        """{fabric: sha256}: cheap, to tell whether any scan changed without reading them."""

        def work(s: Session) -> dict[str, str]:
            rows = s.exec(select(FabricScanRow.name, FabricScanRow.sha256)).all()
            return {name: digest for name, digest in rows}

        return await self._run(work)


    async def members(self, states: Iterable[str]) -> list[MemberRow]:
        """Nodes with a hostname in ``states``: ids, hostnames and versions, no facts."""
        wanted = list(states)

        def work(s: Session) -> list[MemberRow]:
            query = (select(NodeRow.id, NodeRow.hostname, NodeRow.version)
                     .where(col(NodeRow.state).in_(wanted), col(NodeRow.hostname).is_not(None))
                     .order_by(col(NodeRow.id)))
            return [MemberRow(node_id, hostname, str(version))
                    for node_id, hostname, version in s.exec(query).all() if hostname]

        return await self._run(work)

    async def gpu_xml(self, node_ids: Iterable[str]) -> dict[str, str | None]:
        """{node id: its ``facts.last_report.nvidia_smi_xml``, or None} (nodes still
        present). Facts without that key are not even parsed: a rack coming up re-reads
        its members often, and most of their facts are inspection facts."""
        ids = list(node_ids)

        def work(s: Session) -> dict[str, str | None]:
            found: dict[str, str | None] = {}
            for start in range(0, len(ids), 500):
                rows = s.exec(select(NodeRow.id, NodeRow.facts)
                              .where(col(NodeRow.id).in_(ids[start:start + 500]))).all()
                for node_id, text in rows:
                    found[node_id] = _nvidia_smi_xml(text) if _XML_KEY in text else None
            return found

        return await self._run(work)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _to_scan(row: FabricScanRow) -> FabricScan:
    return FabricScan(name=row.name, text=row.text, sha256=row.sha256,
                      reporter_node_id=row.reporter_node_id, received_at=_aware(row.received_at))


_XML_KEY = '"nvidia_smi_xml"'


def _nvidia_smi_xml(text: str) -> str | None:
    try:
        facts = json.loads(text)
    except ValueError:
        return None
    report = facts.get("last_report") if isinstance(facts, dict) else None
    xml = report.get("nvidia_smi_xml") if isinstance(report, dict) else None
    return xml if isinstance(xml, str) and xml.strip() else None
