"""Sign-in, sign-out and the two guards of console handlers: ``page`` (a signed-in session,
else a redirect to the sign-in form) and ``form`` (a session, its CSRF token and a role;
else 403).

Every console POST, the sign-in form's included (which has no session and so no CSRF token
yet: a cross-site page could sign a browser in with the attacker's token), must come from
the console's own origin: a browser names the page that sent a form (``Origin``, else
``Referer``; ``Sec-Fetch-Site``), and another site, or ``Origin: null``, is refused (403).
A client that names none is not a browser following a cross-site form (curl, the CLI)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import quote, urlsplit

from aiohttp import web
from multidict import MultiDict, MultiDictProxy

from provisioner.api import PRINCIPAL, SESSIONS, TOKENS
from provisioner.api.ui import ENV
from provisioner.api.ui.render import html
from provisioner.api.ui.session import COOKIE, Session
from provisioner.domain import Role

PageHandler = Callable[[web.Request, Session], Awaitable[web.StreamResponse]]
FormData = MultiDictProxy[str]
FormHandler = Callable[[web.Request, Session, FormData], Awaitable[web.StreamResponse]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SIGNIN: Final = "/ui/signin"
_MAX_TOKEN_CHARS: Final = 512


async def current(request: web.Request) -> Session | None:
    """The request's live session; its token is looked up again (revoked: signed out)."""
    sessions = request.app[SESSIONS]
    session = sessions.get(request.cookies.get(COOKIE))
    if session is None:
        return None
    info = await request.app[TOKENS].lookup(session.token)
    if info is None:
        sessions.close(session.id)
        return None
    request[PRINCIPAL] = info
    return session


def page(handler: PageHandler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        session = await current(request)
        if session is None:
            raise web.HTTPSeeOther(f"{SIGNIN}?next={quote(request.path_qs, safe='')}")
        return await handler(request, session)

    guarded.__name__ = handler.__name__
    return guarded


def same_origin(request: web.Request) -> bool:
    """Whether a form POST comes from a page of this server (see the module docstring)."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    sender = request.headers.get("Origin") or request.headers.get("Referer")
    if sender is None:
        return True
    try:
        netloc = urlsplit(sender).netloc
    except ValueError:
        return False
    return bool(netloc) and netloc.lower() == (request.host or "").lower()


def _cross_origin(request: web.Request) -> web.Response:
    return refuse(request, 403, "a console form must be sent from the console's own pages "
                                "(cross-origin request refused)")


def form(handler: FormHandler, *, role: Role = Role.OPERATOR) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        if not same_origin(request):
            return _cross_origin(request)
        session = await current(request)
        if session is None:
            return refuse(request, 403, "not signed in (or the session expired)")
        data = await request.post()
        csrf = data.get("csrf")
        if not session.csrf_ok(csrf if isinstance(csrf, str) else None):
            return refuse(request, 403, "missing or wrong CSRF token: reload the page")
        if not session.role.allows(role):
            return refuse(request, 403, f"this needs the {role} role; you signed in as "
                                        f"{session.role}")
        return await handler(request, session, _strings(data))

    guarded.__name__ = handler.__name__
    return guarded


def _strings(data: MultiDictProxy[Any]) -> FormData:
    """The text fields of a form (a file upload is not a console field)."""
    out: MultiDict[str] = MultiDict()
    for key, value in data.items():
        if isinstance(value, str):
            out.add(key, value)
    return MultiDictProxy(out)


def refuse(request: web.Request, status: int, detail: str) -> web.Response:
    return html(request.app[ENV], "error.html.j2",
                {"title": "Refused" if status == 403 else "Error", "detail": detail,
                 "session": None}, status=status)


def _next(raw: str | None) -> str:
    """Only a console path: never an open redirect."""
    if raw and raw.startswith("/ui/") and not raw.startswith("//") and "\\" not in raw:
        return raw
    return "/ui/"


async def signin_form(request: web.Request) -> web.Response:
    return html(request.app[ENV], "signin.html.j2",
                {"next": _next(request.query.get("next")), "error": "", "session": None})


async def signin(request: web.Request) -> web.StreamResponse:
    if not same_origin(request):
        return _cross_origin(request)
    data = await request.post()
    token = data.get("token")
    given = data.get("next")
    target = _next(given if isinstance(given, str) else None)
    info = None
    if isinstance(token, str) and token.strip().isascii() and token.strip().isprintable() \
            and 0 < len(token.strip()) <= _MAX_TOKEN_CHARS:
        info = await request.app[TOKENS].lookup(token.strip())
    if info is None or info.role is Role.AGENT:
        return html(request.app[ENV], "signin.html.j2",
                    {"next": target, "error": "unknown, expired or unusable token",
                     "session": None}, status=401)
    assert isinstance(token, str)
    sessions = request.app[SESSIONS]
    if (previous := request.cookies.get(COOKIE)) is not None:
        sessions.close(previous)  # a new sign-in never keeps the old session id
    session = sessions.open(token.strip(), info.name, info.role)
    response = web.HTTPSeeOther(target)
    response.set_cookie(COOKIE, session.id, max_age=int(sessions.ttl_s), path="/",
                        httponly=True, samesite="Strict", secure=request.secure)
    raise response


async def signout(request: web.Request, session: Session, data: FormData) -> web.Response:
    request.app[SESSIONS].close(session.id)
    response = web.HTTPSeeOther(SIGNIN)
    response.del_cookie(COOKIE, path="/")
    raise response
