"""The boot HTTP server: per-node iPXE scripts, artefacts (sendfile + Range), agent API.

Unknown MACs get the inspection script (and become ``discovered``); known nodes get the script
for their current step; nodes with nothing to do boot from disk. Agent calls carry the node's
single-purpose, expiring token; calls without a valid one are refused (401) and logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from provisioner.boot.render import Renderer
from provisioner.domain import Role
from provisioner.errors import InvalidRequest
from provisioner.ids import normalize_mac
from provisioner.lifecycle.agents import AgentService
from provisioner.lifecycle.discovery import Discovery
from provisioner.lifecycle.states import NodeState
from provisioner.store.tokens import TokenRepo

log = logging.getLogger(__name__)

_NETBOOT_STATES = {NodeState.DISCOVERED: "inspect", NodeState.INSPECTING: "inspect",
                   NodeState.DEPLOYING: "deploy", NodeState.RETIRING: "wipe"}
_MAX_AGENT_BODY = 1 << 20


@dataclass(frozen=True, slots=True)
class BootHttpConfig:
    base_url: str
    artefacts_dir: Path
    assets_dir: Path
    kernel: str
    initrd: str
    kernel_args: str


class BootHttp:
    def __init__(self, config: BootHttpConfig, *, discovery: Discovery, agents: AgentService,
                 tokens: TokenRepo, renderer: Renderer) -> None:
        self._config = config
        self._discovery = discovery
        self._agents = agents
        self._tokens = tokens
        self._renderer = renderer

    def app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_AGENT_BODY)
        app.router.add_get("/boot.ipxe", self.chain_script)
        app.router.add_get("/boot/{mac}.ipxe", self.node_script)
        app.router.add_get("/artefacts/{path:.+}", self.artefact)
        app.router.add_get("/ipxe/{path:.+}", self.asset)
        app.router.add_post("/agent/v1/facts", self.agent_facts)
        app.router.add_get("/agent/v1/command", self.agent_command)
        app.router.add_post("/agent/v1/result", self.agent_result)
        return app

    # -- iPXE scripts -----------------------------------------------------------------------

    async def chain_script(self, request: web.Request) -> web.Response:
        return _script(self._renderer.render("boot", base_url=self._config.base_url))

    async def node_script(self, request: web.Request) -> web.Response:
        try:
            mac = normalize_mac(request.match_info["mac"])
        except InvalidRequest as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        node = await self._discovery.ensure_node(mac, "ipxe")
        if node is None:
            return _script(self._renderer.render(
                "retry", base_url=self._config.base_url, mac=mac, seconds=10,
                reason="discovery rate exceeded"))
        purpose = _NETBOOT_STATES.get(node.state)
        if purpose is None or node.maintenance:
            reason = "in maintenance" if node.maintenance else f"node is {node.state}"
            log.info("node %s: served local boot (%s)", node.id, reason)
            return _script(self._renderer.render("local", reason=reason))
        token = await self._agents.issue_token(node.id)
        log.info("node %s: served %s script to %s", node.id, purpose, mac)
        cfg = self._config
        return _script(self._renderer.render(
            "agent", purpose=purpose, node_id=node.id, mac=mac, base_url=cfg.base_url,
            kernel=cfg.kernel, initrd=cfg.initrd, kernel_args=cfg.kernel_args, token=token))

    # -- files --------------------------------------------------------------------------------

    async def artefact(self, request: web.Request) -> web.FileResponse:
        return _jailed_file(self._config.artefacts_dir, request.match_info["path"])

    async def asset(self, request: web.Request) -> web.FileResponse:
        return _jailed_file(self._config.assets_dir, request.match_info["path"])

    # -- agent API ----------------------------------------------------------------------------

    async def agent_facts(self, request: web.Request) -> web.Response:
        node_id = await self._authenticate(request)
        body = await _json_body(request)
        mac = body.get("mac", "")
        if not isinstance(mac, str):
            raise _problem(422, "mac: must be a string")
        try:
            result = await self._agents.report(node_id, mac, body.get("facts"))
        except InvalidRequest as exc:
            log.warning("node %s: agent report refused: %s", node_id, exc)
            raise _problem(422, str(exc)) from None
        reply: dict[str, object] = {"accepted": True, "node_id": result.node_id}
        if result.token is not None:
            reply["token"] = result.token
        return web.json_response(reply)

    async def agent_command(self, request: web.Request) -> web.Response:
        node_id = await self._authenticate(request)
        return web.json_response(await self._agents.command(node_id))

    async def agent_result(self, request: web.Request) -> web.Response:
        node_id = await self._authenticate(request)
        body = await _json_body(request)
        log.info("node %s: agent ran %s: %s", node_id, body.get("command"),
                 "ok" if body.get("ok") else body.get("error", "failed"))
        await self._agents.result(node_id, body)
        return web.json_response({"recorded": True})

    async def _authenticate(self, request: web.Request) -> str:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        info = await self._tokens.lookup(token) if scheme == "Bearer" and token else None
        if info is None or info.role is not Role.AGENT or info.node_id is None:
            log.warning("agent call %s from %s refused: missing or invalid token",
                        request.path, request.remote)
            raise _problem(401, "missing, expired or invalid agent token")
        return info.node_id


def _script(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/plain")


_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 422: web.HTTPUnprocessableEntity}


def _problem(status: int, detail: str) -> web.HTTPException:
    error_class = _ERRORS[status]
    body = json.dumps({"title": error_class().reason, "status": status, "detail": detail})
    return error_class(text=body, content_type="application/problem+json")


async def _json_body(request: web.Request) -> dict[str, object]:
    try:
        body = await request.json()
    except ValueError:
        raise _problem(400, "body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _problem(422, "body must be a JSON object")
    return body


def _jailed_file(root: Path, relative: str) -> web.FileResponse:
    """A file under ``root``; traversal, absolute paths and links out of it are 404."""
    base = root.resolve()
    target = (base / relative).resolve()
    if not target.is_relative_to(base) or not target.is_file():
        raise web.HTTPNotFound(text=f"no such file: {relative}")
    return web.FileResponse(target, chunk_size=256 * 1024)
