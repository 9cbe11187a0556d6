"""HTTP Basic credentials as the small Redfish servers of the tests check them."""

from __future__ import annotations

import base64
import binascii

from aiohttp import web


def basic_auth_ok(request: web.Request, user: str, password: str) -> bool:
    """The request carries ``Authorization: Basic`` for exactly ``user:password``."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Basic":
        return False
    try:
        return base64.b64decode(value).decode() == f"{user}:{password}"
    except (binascii.Error, UnicodeDecodeError):
        return False
