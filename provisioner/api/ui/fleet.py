"""``/ui/``: the fleet. Counts by state (failed and maintenance first), a rack elevation
(racks as columns, nodes by position, coloured by state, marks for maintenance and failed
validation) and the node table with the filters of ``GET /api/v1/nodes``, paginated."""

from __future__ import annotations

import asyncio
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode

from aiohttp import web
from pydantic import ValidationError

from provisioner.api import CONDUCTOR, NODES, SETTINGS
from provisioner.api.schemas import NodeListQuery, error_items
from provisioner.api.ui import ENV
from provisioner.api.ui.auth import page
from provisioner.api.ui.render import SECURITY_HEADERS
from provisioner.api.ui.session import Session
from provisioner.domain import Node, NodeFilter, NodeSummary
from provisioner.lifecycle.states import FAILED, IN_FLIGHT, NodeState

PAGE_SIZE: Final = 100
_DIGITS: Final = re.compile(r"(\d+)")
_ORDER: Final = [str(s) for s in NodeState]


@dataclass(frozen=True, slots=True)
class Count:
    label: str
    count: int
    kind: str  # failed, maintenance, in-flight, stable
    href: str


@dataclass(frozen=True, slots=True)
class Rack:
    name: str
    nodes: tuple[NodeSummary, ...]


def natural(text: str | None) -> tuple[object, ...]:
    """Sort key: ``r2`` before ``r10``, ``u2`` before ``u10``; None last."""
    if text is None:
        return ((1,),)
    return tuple((0, int(part)) if part.isdigit() else (0, part)
                 for part in _DIGITS.split(text) if part)


def counts(nodes: Sequence[NodeSummary]) -> list[Count]:
    by_state = Counter(n.state for n in nodes)
    failed = sorted((s for s in by_state if s in FAILED), key=lambda s: -by_state[s])
    rest = sorted((s for s in by_state if s not in FAILED),
                  key=lambda s: _ORDER.index(s) if s in _ORDER else len(_ORDER))
    out = [Count(s, by_state[s], "failed", "?" + urlencode({"state": s})) for s in failed]
    held = sum(1 for n in nodes if n.maintenance)
    out.append(Count("maintenance", held, "maintenance", "?maintenance=true"))
    out += [Count(s, by_state[s], "in-flight" if s in IN_FLIGHT else "stable",
                  "?" + urlencode({"state": s})) for s in rest]
    return out


def racks(nodes: Iterable[NodeSummary]) -> list[Rack]:
    grouped: defaultdict[str, list[NodeSummary]] = defaultdict(list)
    for node in nodes:
        grouped[node.rack or ""].append(node)
    return [Rack(name or "(no rack)", tuple(sorted(
                members, key=lambda n: (natural(n.position), natural(n.hostname)))))
            for name, members in sorted(grouped.items(),
                                        key=lambda item: (item[0] == "", natural(item[0])))]


def _query(request: web.Request) -> tuple[dict[str, str], NodeListQuery | None, str]:
    """The filters as given (empty form fields dropped) and as validated, or the error."""
    given = {k: v for k, v in request.query.items()
             if k in NodeListQuery.model_fields and v.strip()}
    given.setdefault("limit", str(PAGE_SIZE))
    context = {"page_size_max": request.app[SETTINGS].page_size_max}
    try:
        return given, NodeListQuery.model_validate(given, context=context), ""
    except ValidationError as exc:
        first = error_items(exc)[0]
        return given, None, f"invalid filter: {first.loc}: {first.msg}"


@page
async def fleet(request: web.Request, session: Session) -> web.Response:
    given, query, error = _query(request)
    repo = request.app[NODES]
    everyone = await repo.summaries()
    items: list[Node] = []
    total = 0
    if query is not None:
        flt = NodeFilter(state=query.state, rack=query.rack, profile=query.profile,
                         maintenance=query.maintenance, query=query.q)
        items, total = await repo.list(flt, limit=query.limit, offset=query.offset)
    status = request.app[CONDUCTOR].step_status
    context = {
        "session": session, "counts": counts(everyone), "racks": racks(everyone),
        "fleet_total": len(everyone), "items": items, "total": total, "error": error,
        "step_status": {n.id: status(n.id) for n in items}, "filters": given,
        "states": _ORDER, "pages": _pages(given, query, total),
    }
    template = request.app[ENV].get_template("fleet.html.j2")
    # 10,000 rack cells take tens of milliseconds to render: off the event loop
    body = await asyncio.to_thread(template.render, **context)
    return web.Response(text=body, status=422 if error else 200, content_type="text/html",
                        charset="utf-8", headers=SECURITY_HEADERS)


def _pages(given: Mapping[str, str], query: NodeListQuery | None,
           total: int) -> dict[str, str]:
    if query is None:
        return {}
    links: dict[str, str] = {}
    if query.offset > 0:
        links["prev"] = "?" + urlencode({**given, "offset": max(0, query.offset - query.limit)})
    if query.offset + query.limit < total:
        links["next"] = "?" + urlencode({**given, "offset": query.offset + query.limit})
    first = query.offset + 1 if total else 0
    links["range"] = f"{first}–{min(total, query.offset + query.limit)} of {total}"
    return links
