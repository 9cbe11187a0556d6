"""Pages and assets: jinja2 templates (autoescape on for every template), security headers on
every page (a strict Content-Security-Policy: no inline script or style, nothing from
elsewhere), and the package's static files served with a content hash and long caching."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final
from urllib.parse import quote

from aiohttp import hdrs, web
from jinja2 import Environment, PackageLoader, StrictUndefined

CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
              "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
              "base-uri 'none'")
SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    hdrs.CACHE_CONTROL: "no-store",
}
_MEDIA: Final = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
_URL_SAFE: Final = re.compile(r"^[A-Za-z0-9._~-]+$")


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    media: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """Every file of ``static/``, read once at start."""
    found: dict[str, Asset] = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _MEDIA:
            body = entry.read_bytes()
            found[entry.name] = Asset(body, _MEDIA[suffix],
                                      hashlib.sha256(body).hexdigest()[:16])
    return found


def node_ref(hostname: str | None, node_id: str) -> str:
    """The path segment of a node's page: its hostname when that is a plain URL segment
    (the documented ``/ui/nodes/<hostname>``), else its id."""
    if hostname and _URL_SAFE.match(hostname):
        return hostname
    return quote(node_id, safe="")


def make_environment(assets: Mapping[str, Asset]) -> Environment:
    env = Environment(loader=PackageLoader(__package__ or "provisioner.api.ui", "templates"),
                      autoescape=True, undefined=StrictUndefined, trim_blocks=True,
                      lstrip_blocks=True, enable_async=False)

    def asset_url(name: str) -> str:
        return f"/ui/static/{name}?v={assets[name].etag}"

    env.globals["asset"] = asset_url
    env.globals["node_ref"] = node_ref
    env.filters["q"] = lambda value: quote(str(value), safe="")
    return env


def html(env: Environment, template: str, context: Mapping[str, Any], *,
         status: int = 200) -> web.Response:
    body = env.get_template(template).render(**context)
    return web.Response(text=body, status=status, content_type="text/html",
                        charset="utf-8", headers=SECURITY_HEADERS)


async def serve_asset(request: web.Request, assets: Mapping[str, Asset]) -> web.Response:
    asset = assets.get(request.match_info["name"])
    if asset is None:
        raise web.HTTPNotFound(text="no such asset")
    versioned = request.query.get("v") == asset.etag
    headers = {hdrs.ETAG: f'"{asset.etag}"', "X-Content-Type-Options": "nosniff",
               hdrs.CACHE_CONTROL: "public, max-age=31536000, immutable" if versioned
               else "public, max-age=300"}
    if request.headers.get(hdrs.IF_NONE_MATCH) == f'"{asset.etag}"':
        return web.Response(status=304, headers=headers)
    return web.Response(body=asset.body, content_type=asset.media, headers=headers)
