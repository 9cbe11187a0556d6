"""``GET /api/v1/history``: the fleet's audit trail, every node's history rows filtered by time
(``since`` ≤ at < ``until``), ``actor`` (a trailing ``*``: a prefix, ``token:*``), ``event``
(repeatable: any of them) and ``node`` (id or hostname); newest first by default, or oldest
first (``order=oldest``: a script resumes where it stopped). A page holds ``limit`` rows;
``next_cursor``, when set, is the ``cursor`` of the next page (the last row's fleet-wide id,
the ``transition`` of ``provisioner events``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Final, Literal

from aiohttp import web
from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    Field,
    StringConstraints,
)

from provisioner.api import NODES, SETTINGS
from provisioner.api.nodes import query_params
from provisioner.api.openapi import Route
from provisioner.api.schemas import PagedQuery, respond
from provisioner.domain import FleetEvent, Role
from provisioner.store.history import AuditQuery

PREFIX: Final = "/api/v1"
_ONE_LINE: Final = r"^[^\x00-\x1f\x7f]*$"
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=253,
                                        pattern=_ONE_LINE)]


def _many(value: object) -> object:
    return (value,) if isinstance(value, str) else value


class HistoryQuery(PagedQuery):
    """Query parameters of ``GET /history``."""

    since: AwareDatetime | None = Field(None, description="rows at or after (ISO 8601, with "
                                                          "its offset)")
    until: AwareDatetime | None = Field(None, description="rows before (ISO 8601)")
    actor: Text | None = Field(None, description="who: exact, or a prefix ending in *")
    event: Annotated[tuple[Text, ...], BeforeValidator(_many),
                     Field(min_length=1, max_length=64)] | None = None
    node: Text | None = Field(None, description="node id or hostname")
    order: Literal["newest", "oldest"] = "newest"
    cursor: int | None = Field(None, ge=0, description="the next_cursor of the page before")
    limit: int = Field(100, ge=1, description="Page size (at most the configured maximum)")


class AuditOut(BaseModel):
    transition: int = Field(description="the row's fleet-wide id")
    id: str = Field(description="the node's id")
    hostname: str | None
    seq: int
    event: str
    from_state: str
    to_state: str
    actor: str
    reason: str
    at: datetime
    instance: str | None = None


class AuditPage(BaseModel):
    items: list[AuditOut]
    next_cursor: int | None = Field(description="pass as cursor for the next page; null: the "
                                                "last page")


def audit_out(found: FleetEvent) -> AuditOut:
    entry = found.entry
    at = entry.at if entry.at.tzinfo else entry.at.replace(tzinfo=UTC)
    return AuditOut(transition=found.id, id=entry.node_id, hostname=found.hostname,
                    seq=entry.seq, event=entry.event, from_state=entry.from_state,
                    to_state=entry.to_state, actor=entry.actor, reason=entry.reason, at=at,
                    instance=entry.instance)


async def list_history(request: web.Request) -> web.Response:
    context = {"page_size_max": request.app[SETTINGS].page_size_max}
    query = HistoryQuery.model_validate(query_params(request, frozenset({"event"})),
                                        context=context)
    found = await request.app[NODES].audit(AuditQuery(
        since=_utc(query.since), until=_utc(query.until), actor=query.actor,
        events=tuple(query.event or ()), node=query.node, after=query.cursor,
        oldest_first=query.order == "oldest", limit=query.limit))
    more = len(found) == query.limit
    return respond(AuditPage(items=[audit_out(f) for f in found],
                             next_cursor=found[-1].id if found and more else None))


def _utc(moment: datetime | None) -> datetime | None:
    """In UTC, as the history's ``created_at`` is written (SQLite keeps no offset)."""
    return None if moment is None else moment.astimezone(UTC)


ROUTES: Final = (
    Route("GET", f"{PREFIX}/history", list_history,
          "The fleet's history (every node's transitions and notes), filtered and paged",
          Role.VIEWER, AuditPage, query=HistoryQuery, errors=(422,)),
)
