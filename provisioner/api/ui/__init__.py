"""The operator console under ``/ui/``: server-rendered pages (jinja2, autoescaped), a few
vanilla JavaScript modules for live updates, every asset shipped in this package.

``setup(app)`` registers the routes and returns them; the API's auth middleware lets them
through (they check the console session themselves: ``auth.page`` and ``auth.form``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aiohttp import web
from jinja2 import Environment

from provisioner.api.ui.render import Asset
from provisioner.lifecycle.validation import DomainWatch

ENV: Final = web.AppKey("ui_env", Environment)
ASSETS: Final[web.AppKey[Mapping[str, Asset]]] = web.AppKey("ui_assets")
DOMAINS: Final = web.AppKey("ui_domains", DomainWatch)
