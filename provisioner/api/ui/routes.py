"""The console's routes, registered by ``setup`` (called from ``api.app.make_app``)."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from provisioner.api.ui import ASSETS, DOMAINS, ENV
from provisioner.api.ui.acceptance import accept
from provisioner.api.ui.auth import Handler, form, page, refuse, signin, signin_form, signout
from provisioner.api.ui.fabric import domain_page, fabric_page
from provisioner.api.ui.firmware import firmware_page
from provisioner.api.ui.fleet import FLEET, FleetView, fleet
from provisioner.api.ui.health import health_page
from provisioner.api.ui.node import act, node_page
from provisioner.api.ui.render import load_assets, make_environment, serve_asset
from provisioner.api.ui.session import Session
from provisioner.domain import Role
from provisioner.lifecycle.validation import DomainWatch
from provisioner.store.repo import NodeRepo


async def _to_fleet(request: web.Request) -> web.StreamResponse:
    raise web.HTTPMovedPermanently("/ui/")


@page
async def _unknown(request: web.Request, session: Session) -> web.Response:
    return refuse(request, 404, f"no console page at {request.path[:200]}")


async def _asset(request: web.Request) -> web.Response:
    return await serve_asset(request, request.app[ASSETS])


def setup(app: web.Application, nodes: NodeRepo, *,
          domain_poll_s: float = 2.0) -> Sequence[tuple[str, str]]:
    """Register the console on ``app``; return its (method, canonical path) pairs (no
    bearer token: the handlers check the session)."""
    assets = load_assets()
    app[ASSETS] = assets
    app[ENV] = make_environment(assets)
    app[DOMAINS] = DomainWatch(nodes, interval_s=domain_poll_s)
    app[FLEET] = FleetView()
    table: list[tuple[str, str, Handler]] = [
        ("GET", "/ui", _to_fleet),
        ("GET", "/ui/", fleet),
        ("GET", "/ui/signin", signin_form),
        ("POST", "/ui/signin", signin),
        ("POST", "/ui/signout", form(signout, role=Role.VIEWER)),
        ("GET", "/ui/nodes/{node}", node_page),
        ("POST", "/ui/nodes/{node}/{kind:action|power|bootdev}", act),
        ("GET", "/ui/fabric", fabric_page),
        ("GET", "/ui/fabric/domains/{clique}", domain_page),
        ("POST", "/ui/fabric/domains/{clique}/accept", accept),
        ("GET", "/ui/firmware", firmware_page),
        ("GET", "/ui/health", health_page),
        ("GET", "/ui/static/{name}", _asset),
        ("GET", "/ui/{tail:.*}", _unknown),  # last: any other console path
    ]
    added = [app.router.add_route(method, path, handler) for method, path, handler in table]
    return [(r.method, r.resource.canonical) for r in added if r.resource is not None]
