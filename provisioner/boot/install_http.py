"""The installer path on the boot HTTP server: a deploying node whose profile uses an
installer gets that installer's iPXE script, and the installer then fetches its documents
(``user-data``, ``meta-data``, ``vendor-data``, ``preseed.cfg``, ``ks.cfg``) from
``/install/<token>/``.

Installers cannot send headers, so the node's agent token is in the path. It is the only key:
a request renders the documents of the node the token belongs to and no other, and a missing,
expired or non-agent token is refused (401) and logged without the token itself.
"""

from __future__ import annotations

import json
import logging
import re

from aiohttp import web

from provisioner.boot.render import Renderer
from provisioner.domain import Node, NodeState, Role
from provisioner.errors import ProvisionerError
from provisioner.install.unattended import UnattendedInstalls
from provisioner.lifecycle.agent_binding import SourceRefused
from provisioner.lifecycle.agents import AgentService
from provisioner.store.repo import NodeRepo
from provisioner.store.tokens import TokenRepo

log = logging.getLogger(__name__)
_RETRY_S = 60
_UNSAFE = re.compile(r"[^A-Za-z0-9 .,:()/_-]")
_DOCUMENT = re.compile(r"[a-z-]+(\.cfg)?")


class InstallerHttp:
    def __init__(self, installs: UnattendedInstalls, *, base_url: str, nodes: NodeRepo,
                 tokens: TokenRepo, renderer: Renderer,
                 agents: AgentService | None = None) -> None:
        self._installs = installs
        self._agents = agents  # the token's address binding (``agent_binding``)
        self._base_url = base_url
        self._nodes = nodes
        self._tokens = tokens
        self._renderer = renderer

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/install/{token}/{document}", self.document)

    async def script(self, node: Node, token: str, mac: str, *,
                     grub: bool = False) -> str | None:
        """The deploying node's iPXE script (``grub``: its arm64 grub.cfg) when its profile
        uses an installer, else None. Once the ``installed`` callback is checkpointed: a
        local boot (never a second install). A node the installer cannot take (no hostname,
        no fitting disk, no arm64 kernel): a script that says why and asks again in a
        minute."""
        if not self._installs.uses_installer(node):
            return None
        render = self._renderer.render_grub if grub else self._renderer.render
        node = await self._nodes.get(node.id)  # the boot cache's copy has no fresh checkpoint
        if self._installs.installed(node):
            log.info("node %s: installed; served local boot", node.id)
            return render("local", reason="installed, booting from disk")
        try:
            plan = self._installs.plan(node, token=token, mac=mac,
                                       arch="arm64" if grub else "x86_64")
        except ProvisionerError as exc:
            log.warning("node %s: cannot serve the installer: %s", node.id, exc)
            reason = _UNSAFE.sub(" ", f"cannot install: {exc}")[:200]
            return render("retry", base_url=self._base_url, mac=mac, seconds=_RETRY_S,
                          reason=reason)
        log.info("node %s: served %s installer %s to %s", node.id, plan.method,
                 "grub.cfg" if grub else "script", mac)
        return render(f"install/{plan.method}", **plan.values())

    async def document(self, request: web.Request) -> web.Response:
        token, name = request.match_info["token"], request.match_info["document"]
        info = await self._tokens.lookup(token)
        if info is None or info.role is not Role.AGENT or info.node_id is None:
            log.warning("installer fetch of %s from %s refused: missing or invalid token",
                        _UNSAFE.sub("?", name)[:40], request.remote)
            raise _problem(web.HTTPUnauthorized, "missing, expired or invalid agent token")
        if self._agents is not None:
            try:
                await self._agents.check_source(info, token, request.remote,
                                                local=_local_address(request))
            except SourceRefused as exc:
                raise _problem(web.HTTPForbidden, str(exc)) from None
        node = await self._nodes.get(info.node_id)
        if not _DOCUMENT.fullmatch(name) or not self._installs.serves(node, name):
            method = self._installs.method(node) or "no installer"
            raise _problem(web.HTTPNotFound, f"node {node.id} ({method}) has no document "
                           f"{name[:40]!r}")
        if node.state is not NodeState.DEPLOYING or node.maintenance:
            state = "in maintenance" if node.maintenance else str(node.state)
            log.warning("node %s: installer fetched %s while %s: refused", node.id, name, state)
            raise _problem(web.HTTPConflict, f"node {node.id} is {state}, not deploying")
        try:
            plan = self._installs.plan(node, token=token)
        except ProvisionerError as exc:
            log.warning("node %s: cannot render %s: %s", node.id, name, exc)
            raise _problem(web.HTTPConflict, str(exc)) from None
        text = self._renderer.render_document(f"install/{name}.j2", **plan.values())
        log.info("node %s: served installer %s", node.id, name)
        return web.Response(text=text, content_type="text/plain")


def _local_address(request: web.Request) -> str | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return str(sockname[0]) if isinstance(sockname, tuple) and sockname else None


def _problem(error_class: type[web.HTTPException], detail: str) -> web.HTTPException:
    body = json.dumps({"title": error_class().reason, "status": error_class.status_code,
                       "detail": detail})
    return error_class(text=body, content_type="application/problem+json")
