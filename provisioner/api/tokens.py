"""``/api/v1/tokens``: API tokens, for admins only. A token's secret is in the response that
creates it and nowhere else (the store keeps its SHA-256 only); listing shows names, roles
and expiry; revoking deletes it, so it fails at once (console sessions opened with it end at
their next request)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated, Final, Literal

from aiohttp import web
from pydantic import BaseModel, Field, StringConstraints

from provisioner.api import SETTINGS, TOKENS, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import _Request, parse_json, respond
from provisioner.domain import Role, TokenInfo
from provisioner.errors import NotFound
from provisioner.store.tokens import expiry

log = logging.getLogger(__name__)

PATH: Final = "/api/v1/tokens"
_MAX_LIFETIME_S: Final = 10 * 366 * 86400  # ten years: beyond is "never" (say no_expiry)

TokenName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                             max_length=128, pattern=r"^[A-Za-z0-9._@:-]+$")]


class TokenCreate(_Request):
    name: TokenName
    role: Literal["viewer", "operator", "admin"]
    expires_in_s: int | None = Field(
        None, ge=60, le=_MAX_LIFETIME_S,
        description="Lifetime in seconds; absent: the site's api.token_lifetime_days")
    no_expiry: bool = Field(False, description="A token that never expires")


class TokenOut(BaseModel):
    id: str
    name: str
    role: str
    created_at: datetime | None
    expires_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="The secret: shown in this response only, never again")


class TokenPage(BaseModel):
    items: list[TokenOut]


async def list_tokens(request: web.Request) -> web.Response:
    tokens = await request.app[TOKENS].api_tokens()
    return respond(TokenPage(items=[_out(info) for info in tokens]))


async def create_token(request: web.Request) -> web.Response:
    body = TokenCreate.model_validate(parse_json(await request.read()))
    if body.no_expiry and body.expires_in_s is not None:
        raise web.HTTPUnprocessableEntity(text="give expires_in_s or no_expiry, not both")
    expires_at = expiry(request.app[SETTINGS].token_lifetime_s,
                        expires_in_s=body.expires_in_s, no_expiry=body.no_expiry)
    info, secret = await request.app[TOKENS].create(body.name, Role(body.role),
                                                    expires_at=expires_at)
    log.info("token %r (%s) created by %s", info.name, info.role,
                            actor(request))
    created = TokenCreated(token=secret, **_out(info).model_dump())
    return respond(created, status=201, headers={"Location": f"{PATH}/{info.id}",
                                                 "Cache-Control": "no-store"})


async def revoke_token(request: web.Request) -> web.Response:
    key = request.match_info["id"]
    if not key.isprintable() or len(key) > 128:
        raise NotFound("token", key[:64])
    info = await request.app[TOKENS].revoke(key)
    log.info("token %r (%s) revoked by %s", info.name, info.role,
                            actor(request))
    return respond(_out(info))


def _out(info: TokenInfo) -> TokenOut:
    return TokenOut(id=info.id, name=info.name, role=str(info.role),
                    created_at=info.created_at,
                    expires_at=info.expires_at.astimezone(UTC) if info.expires_at else None)


_ID: Final = ("id", "the token's id or name")

ROUTES: Final = (
    Route("GET", PATH, list_tokens, "API tokens: names, roles, expiry (never a secret)",
          Role.ADMIN, TokenPage),
    Route("POST", PATH, create_token,
          "Create an API token; the response is the only place its secret appears",
          Role.ADMIN, TokenCreated, status=201, body=TokenCreate, errors=(400, 409, 413, 422)),
    Route("DELETE", f"{PATH}/{{id}}", revoke_token,
          "Revoke an API token at once (it answers 401 from then on)", Role.ADMIN, TokenOut,
          path_params=(_ID,), errors=(404,)),
)
