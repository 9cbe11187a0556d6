"""The aiohttp application: routes, auth, problem+json errors and request timing.

Public (no token): ``/healthz``, ``/openapi.json`` (also under ``/api/v1``) and ``/metrics``.
``/metrics`` is unauthenticated as Prometheus scrapers expect; it exposes only counts and
timings, never node identities. Every other route needs a bearer token: reads ``viewer``,
mutations ``operator``, and what changes credentials ``admin``: tokens, BMC password rotation,
and an import that changes an existing node's BMC (``Route.role``; the import checks per row).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from http import HTTPStatus
from typing import Final

from aiohttp import hdrs, web
from pydantic import ValidationError

from provisioner.api import (
    ACCEPTANCE,
    CONDUCTOR,
    EVENTS,
    FEED,
    HEALTH,
    KUBE,
    METRICS,
    NODES,
    OWNERSHIP,
    PRINCIPAL,
    PROFILES,
    REPAIRS,
    ROTATION,
    SESSIONS,
    SETTINGS,
    SLURM,
    TOKENS,
    TOPOLOGY,
    WAVES,
)
from provisioner.api.acceptance import ROUTES as ACCEPTANCE_ROUTES
from provisioner.api.audit import ROUTES as AUDIT_ROUTES
from provisioner.api.events import EventFeed, EventHub, stream
from provisioner.api.firmware import ROUTES as FIRMWARE_ROUTES
from provisioner.api.health import ROUTES as HEALTH_ROUTES
from provisioner.api.instances import ROUTES as INSTANCE_ROUTES
from provisioner.api.inventory import ROUTES as INVENTORY_ROUTES
from provisioner.api.nodes import PREFIX
from provisioner.api.nodes import ROUTES as NODE_ROUTES
from provisioner.api.nodes_admin import ROUTES as NODE_ADMIN_ROUTES
from provisioner.api.openapi import Handler, Route, openapi_document
from provisioner.api.power import ROUTES as POWER_ROUTES
from provisioner.api.repair import ROUTES as REPAIR_ROUTES
from provisioner.api.schemas import Health, InvalidRows, Problem, error_items, respond
from provisioner.api.servicing import ROUTES as SERVICING_ROUTES
from provisioner.api.tokens import ROUTES as TOKEN_ROUTES
from provisioner.api.topology import ROUTES as TOPOLOGY_ROUTES
from provisioner.api.ui import routes as ui
from provisioner.api.ui.session import COOKIE, SessionStore
from provisioner.api.why import ROUTES as WHY_ROUTES
from provisioner.config import ApiSettings
from provisioner.config.profiles import ProfileRegistry
from provisioner.domain import Role
from provisioner.errors import (
    Conflict,
    InvalidRequest,
    InvalidTransition,
    NotFound,
    ProvisionerError,
    StoreUnavailable,
)
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.drift import counts as firmware_counts
from provisioner.lifecycle.drift import gauge_fleet, part_counts
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.repair import RepairService
from provisioner.lifecycle.rotation import BmcRotation
from provisioner.lifecycle.waves import WaveDriver
from provisioner.metrics import CONTENT_TYPE, Metrics
from provisioner.slurm.model import SlurmClient
from provisioner.store.ownership import OwnershipRepo
from provisioner.store.repo import NodeRepo
from provisioner.store.tokens import TokenRepo
from provisioner.topology_live.live import LiveTopology

EVENTS_PATH = f"{PREFIX}/events"  # server-sent events: a stream, no request deadline
log = logging.getLogger(__name__)

API_VERSION: Final = "1"
OPENAPI: Final = web.AppKey("openapi", bytes)
#: (method, canonical path) -> least role; None: public
ROLES: Final[web.AppKey[Mapping[tuple[str, str], Role | None]]] = web.AppKey("roles")

_PROBLEM_MEDIA: Final = "application/problem+json"
_STATUS_OF: Final[Sequence[tuple[type[ProvisionerError], int]]] = (
    (NotFound, 404), (Conflict, 409), (InvalidRequest, 422),
    (StoreUnavailable, 503),  # the database is away or full: reads may still work
)
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_MAX_TOKEN_CHARS: Final = 512


def make_app(*, conductor: Conductor, nodes: NodeRepo, tokens: TokenRepo, metrics: Metrics,
             settings: ApiSettings, topology: LiveTopology | None = None,
             rotation: BmcRotation | None = None,
             ownership: OwnershipRepo | None = None,
             repairs: RepairService | None = None,
             acceptance: DomainAcceptance | None = None,
             health: HealthFindings | None = None,
             profiles: ProfileRegistry | None = None,
             slurm: SlurmClient | None = None,
             kube: KubeNodeJoiner | None = None,
             waves: WaveDriver | None = None) -> web.Application:
    routes = (*NODE_ROUTES, *NODE_ADMIN_ROUTES, *INVENTORY_ROUTES, *POWER_ROUTES,
              *REPAIR_ROUTES, *SERVICING_ROUTES, *FIRMWARE_ROUTES, *TOPOLOGY_ROUTES,
              *ACCEPTANCE_ROUTES, *INSTANCE_ROUTES, *TOKEN_ROUTES, *HEALTH_ROUTES,
              *WHY_ROUTES, *AUDIT_ROUTES, *_OWN_ROUTES)
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[_timing, _errors, _auth])
    app[CONDUCTOR], app[NODES], app[TOKENS] = conductor, nodes, tokens
    app[METRICS], app[SETTINGS] = metrics, settings
    if topology is not None:
        app[TOPOLOGY] = topology
    hub = EventHub(settings.events_queue_max)
    feed = EventFeed(nodes, hub)  # every daemon's transitions, from the shared history
    conductor.add_observer(feed.poke)
    app[EVENTS], app[FEED] = hub, feed
    app[SESSIONS] = SessionStore(settings.session_ttl_s)

    async def run_feed(app: web.Application) -> AsyncIterator[None]:
        with contextlib.suppress(Exception):  # the database away: run() tries again
            await feed.read()  # where the stream starts: the newest row now
        task = asyncio.create_task(feed.run(), name="events-feed")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def close_streams(app: web.Application) -> None:
        hub.close()  # before the server waits for handlers: SSE streams end at once

    app.cleanup_ctx.append(run_feed)
    app.on_shutdown.append(close_streams)
    if rotation is not None:
        app[ROTATION] = rotation
    if ownership is not None:
        app[OWNERSHIP] = ownership
    if repairs is not None:
        app[REPAIRS] = repairs
    if acceptance is not None:
        app[ACCEPTANCE] = acceptance
    if health is not None:
        app[HEALTH] = health
    if profiles is not None:
        app[PROFILES] = profiles
    if slurm is not None:
        app[SLURM] = slurm
    if kube is not None:
        app[KUBE] = kube
    if waves is not None:
        app[WAVES] = waves
    roles: dict[tuple[str, str], Role | None] = {(r.method, r.path): r.role for r in routes}
    app[OPENAPI] = openapi_document(routes, title="provisioner", version=API_VERSION)
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
    console = ui.setup(app, nodes)
    roles.update({key: None for key in console})  # the console checks sessions itself
    app[ROLES] = roles
    return app


# -- public handlers ------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return respond(Health(status="ok"))


async def metrics_text(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    await metrics.refresh(request.app[NODES])
    if (health := request.app.get(HEALTH)) is not None:
        await metrics.refresh_health(health.repo)
    fleet = await gauge_fleet(request.app[NODES], request.app[CONDUCTOR].servicing) \
        if metrics.leading else None  # a fleet gauge: the leader reads the fleet
    metrics.refresh_firmware(firmware_counts(fleet) if fleet is not None else None,
                             part_counts(fleet) if fleet is not None else None)
    return web.Response(body=metrics.render(), headers={hdrs.CONTENT_TYPE: CONTENT_TYPE})


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type="application/json")


async def events(request: web.Request) -> web.StreamResponse:
    return await stream(request, request.app[EVENTS], request.app[FEED], request.app[NODES])


_OWN_ROUTES: Final = (
    Route("GET", "/healthz", healthz, "Liveness: 200 while the API serves", None, Health),
    Route("GET", "/metrics", metrics_text, "Prometheus metrics, unauthenticated", None,
          media="text/plain"),
    Route("GET", f"{PREFIX}/openapi.json", openapi_json, "This OpenAPI document", None),
    Route("GET", "/openapi.json", openapi_json, "This OpenAPI document", None),
    Route("GET", EVENTS_PATH, events,
          "The fleet's transitions (every daemon's) as server-sent events (event: "
          "transition, data: JSON, id: the history row's fleet-wide id); Last-Event-ID or "
          "?since=ID resumes after that row, ?last=N starts with the newest N, ?node= keeps "
          "one node's, ?follow=false ends after those rows; a client that falls behind is "
          "dropped (event: dropped). A bearer token, or the console's session cookie",
          Role.VIEWER, media="text/event-stream"),
)


# -- middlewares ----------------------------------------------------------------------------


@web.middleware
async def _timing(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        if not response.prepared:  # a stream (events) has sent its headers already
            elapsed_ms = (time.perf_counter() - started) * 1000
            response.headers["Server-Timing"] = f"app;dur={elapsed_ms:.1f}"
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = 499  # the client went away
        raise
    finally:
        method = request.method if request.method in _METHODS else "OTHER"
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        elapsed = time.perf_counter() - started
        request.app[METRICS].observe_request(method, route, status, elapsed)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_error(exc)
    except ValidationError as exc:
        items = error_items(exc)
        first = items[0]
        detail = f"invalid request: {first.loc}: {first.msg}"
        return problem(422, detail, kind="validation-error", errors=items)
    except InvalidRows as exc:
        return problem(422, str(exc), kind="validation-error", errors=exc.errors)
    except InvalidTransition as exc:
        return problem(409, str(exc), kind="invalid-transition", state=exc.state,
                       allowed_events=list(exc.allowed))
    except ProvisionerError as exc:
        status = next((code for cls, code in _STATUS_OF if isinstance(exc, cls)), None)
        if status is None:  # ConfigError, SchemaError, DriverError: not the caller's fault
            log.exception("%s %s failed", request.method, request.path)
            return problem(500, "internal error; see the daemon log")
        if status >= 500:
            log.warning("%s %s failed: %s", request.method, request.path, exc)
        return problem(status, str(exc))
    except Exception:  # the API's task boundary: log once, with the traceback
        log.exception("%s %s failed", request.method, request.path)
        return problem(500, "internal error; see the daemon log")


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    route = request.match_info.route
    key = (route.method, route.resource.canonical if route.resource is not None else "")
    needed = request.app[ROLES].get(key, Role.VIEWER)  # unmatched paths: no hints without one
    if needed is None:
        return await handler(request)
    token = _bearer(request)
    if token is None and request.method == "GET":  # the console's own reads (never writes)
        session = request.app[SESSIONS].get(request.cookies.get(COOKIE))
        token = session.token if session is not None else None
    info = await request.app[TOKENS].lookup(token) if token else None
    if info is None:
        return _unauthorized(invalid=token is not None)
    if not info.role.allows(needed):
        return problem(403, f"this needs the {needed} role; token {info.name!r} has "
                            f"{info.role}")
    request[PRINCIPAL] = info
    return await handler(request)


def _bearer(request: web.Request) -> str | None:
    """The bearer token; "" when one is given but cannot be valid; None when none is given."""
    scheme, _, token = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
    if scheme.lower() != "bearer":
        return "" if scheme else None
    token = token.strip()
    if not token.isascii() or not token.isprintable() or len(token) > _MAX_TOKEN_CHARS:
        return ""
    return token


def _unauthorized(*, invalid: bool) -> web.Response:
    challenge = 'Bearer realm="provisioner"'
    if invalid:
        challenge += ', error="invalid_token"'
        detail = "the bearer token is unknown, expired or malformed"
    else:
        detail = "this needs a bearer token (Authorization: Bearer <token>)"
    return problem(401, detail, headers={hdrs.WWW_AUTHENTICATE: challenge})


# -- problem documents ----------------------------------------------------------------------


def problem(status: int, detail: str, *, kind: str = "about:blank",
            headers: Mapping[str, str] | None = None, **extra: object) -> web.Response:
    """An RFC 9457 problem+json response; ``detail`` is one line, without internals."""
    lines = [line for line in detail.splitlines() if line.strip()]
    line = lines[0] if lines else HTTPStatus(status).description
    body = Problem.model_validate({"type": kind, "title": HTTPStatus(status).phrase,
                                   "status": status, "detail": line, **extra})
    return web.Response(text=body.model_dump_json(exclude_none=True), status=status,
                        headers=headers, content_type=_PROBLEM_MEDIA)


def _from_http_error(exc: web.HTTPException) -> web.Response:
    """aiohttp's own errors (404 route, 405, 413 body too large, our 400/415) as problems."""
    default = f"{exc.status}: {exc.reason}"
    detail = exc.text if exc.text and exc.text != default else ""
    kept = {name: value for name, value in exc.headers.items()
            if name not in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH)}
    return problem(exc.status, detail, headers=kept)

