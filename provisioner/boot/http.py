"""The boot HTTP server: per-node iPXE scripts, artefacts (sendfile + Range), agent API.

Unknown MACs get the inspection script (and become ``discovered``); known nodes get the script
for their current step; nodes with nothing to do boot from disk. Agent calls carry the node's
single-purpose, expiring token; calls without a valid one are refused (401) and logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from aiohttp import web

from provisioner.agent.facts import MAX_NVIDIA_SMI_XML_BYTES
from provisioner.boot.flood import PerKeyLimit
from provisioner.boot.http_sendfile import SendfileThreads
from provisioner.boot.install_http import InstallerHttp, _local_address
from provisioner.boot.render import Renderer
from provisioner.domain import Node, NodeState, Role, TokenInfo
from provisioner.errors import InvalidRequest
from provisioner.health.inband import MAX_BODY_BYTES as MAX_PROBE_BYTES
from provisioner.ids import normalize_mac
from provisioner.lifecycle.agent_binding import SourceRefused
from provisioner.lifecycle.agents import AgentService
from provisioner.lifecycle.discovery import Discovery
from provisioner.lifecycle.fabrics import DEFAULT_FABRIC, FabricRefused, FabricReports
from provisioner.lifecycle.inband import (
    InbandIntake,
    ProbeRefused,
    ProbeTooSoon,
    is_probe_token,
)
from provisioner.lifecycle.service_record import ServiceRecord
from provisioner.store.tokens import TokenRepo

log = logging.getLogger(__name__)

_NETBOOT_STATES = {NodeState.DISCOVERED: "inspect", NodeState.INSPECTING: "inspect",
                   NodeState.DEPLOYING: "deploy", NodeState.RETIRING: "sanitise"}
# A report may carry nvidia-smi -q -x verbatim; JSON escapes its tabs and newlines.
_MAX_AGENT_BODY = 2 * MAX_NVIDIA_SMI_XML_BYTES + (1 << 20)
DISCOVERIES_PER_SOURCE_PER_S, DISCOVERY_BURST_PER_SOURCE = 0.5, 10
FABRIC_SCANS_PER_S, FABRIC_SCAN_BURST = 1 / 60, 3
MAX_JSON_DEPTH = 64  # an agent report nests 5 deep; json.loads gives up near 1,000


def _servicing_netboot(node: Node) -> str | None:
    """A servicing node boots the agent's ramdisk only while a step needs it (the storage
    layout's mdadm arrays); else its own disk."""
    if node.state is not NodeState.SERVICING:
        return None
    record = ServiceRecord.from_facts(node.facts)
    return "service" if record is not None and record.netboot else None


class _Flavour(StrEnum):
    """The boot loader that asks: iPXE (x86) or GRUB (arm64: Debian has no arm64 iPXE)."""

    IPXE = "ipxe"
    GRUB = "grub"

    @property
    def label(self) -> str:
        return "script" if self is _Flavour.IPXE else "grub.cfg"


@dataclass(frozen=True, slots=True)
class BootHttpConfig:
    base_url: str
    artefacts_dir: Path
    assets_dir: Path
    kernel: str
    initrd: str
    kernel_args: str
    kernel_arm64: str = "inspect/arm64/vmlinuz"
    initrd_arm64: str = "inspect/arm64/initrd.gz"
    kernel_args_arm64: str = "console=ttyAMA0"
    sendfile_threads: int = 3  # 0: aiohttp's sendfile in the loop's thread
    sendfile_pumps: bool = True  # the threads own their downloads (boot/http_pumps.py)


class BootHttp:
    def __init__(self, config: BootHttpConfig, *, discovery: Discovery, agents: AgentService,
                 tokens: TokenRepo, renderer: Renderer, fabrics: FabricReports | None = None,
                 max_fabric_bytes: int = 32 << 20,
                 installer: InstallerHttp | None = None,
                 inband: InbandIntake | None = None) -> None:
        self._config = config
        self._inband = inband
        self._installer = installer
        self._fabrics = fabrics
        self._max_fabric_bytes = max_fabric_bytes
        self._discovery = discovery
        self._agents = agents
        self._tokens = tokens
        self._renderer = renderer
        self._sendfile = SendfileThreads(config.sendfile_threads,
                                         pumps=config.sendfile_pumps) \
            if config.sendfile_threads else None
        # unknown MACs one address may have discovered: a flood of made-up MACs from one
        # machine cannot use up the discovery rate every new machine shares
        self._discoveries = PerKeyLimit(rate_per_s=DISCOVERIES_PER_SOURCE_PER_S,
                                        burst=DISCOVERY_BURST_PER_SOURCE,
                                        max_in_flight=1 << 30)
        # fabric scans per node: one at a time, a few at once, then a slow rate
        self._fabric_posts = PerKeyLimit(rate_per_s=FABRIC_SCANS_PER_S,
                                         burst=FABRIC_SCAN_BURST, max_in_flight=1)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_AGENT_BODY)
        app.on_cleanup.append(self._close)
        app.router.add_get("/boot.ipxe", self.chain_script)
        app.router.add_get("/boot/{mac}.ipxe", self.node_script)
        app.router.add_get("/boot/{mac}.grub", self.node_grub)
        app.router.add_get("/artefacts/{path:.+}", self.artefact)
        app.router.add_get("/ipxe/{path:.+}", self.asset)
        app.router.add_post("/agent/v1/facts", self.agent_facts)
        app.router.add_get("/agent/v1/command", self.agent_command)
        app.router.add_post("/agent/v1/result", self.agent_result)
        app.router.add_get("/agent/v1/seed", self.agent_seed)
        app.router.add_post("/agent/v1/callback", self.agent_callback)
        if self._fabrics is not None:
            app.router.add_post("/agent/v1/fabric", self.agent_fabric)
        if self._inband is not None:
            app.router.add_post("/agent/v1/health", self.agent_health)
        if self._installer is not None:
            self._installer.add_routes(app)
        return app

    # -- iPXE scripts -----------------------------------------------------------------------

    async def chain_script(self, request: web.Request) -> web.Response:
        return _script(self._renderer.render("boot", base_url=self._config.base_url))

    async def node_script(self, request: web.Request) -> web.Response:
        """The node's iPXE script (x86 BIOS and UEFI, through iPXE)."""
        return _script(await self._node_boot(request, _Flavour.IPXE))

    async def node_grub(self, request: web.Request) -> web.Response:
        """The node's ``grub.cfg`` (arm64 UEFI: the GRUB image we serve asks for it)."""
        return _script(await self._node_boot(request, _Flavour.GRUB))

    async def _node_boot(self, request: web.Request, flavour: _Flavour) -> str:
        """Inspection (unknown MACs too), the node's current step, or a local boot: the same
        choice for iPXE and GRUB, rendered in the loader's language."""
        try:
            mac = normalize_mac(request.match_info["mac"])
        except InvalidRequest as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        render = self._renderer.render_grub if flavour is _Flavour.GRUB \
            else self._renderer.render
        if await self._discovery.lookup(mac) is None:  # a discovery: its source's budget
            source = request.remote or ""
            if self._discoveries.admit(source) is not None:
                log.debug("boot script for unknown %s from %s deferred", mac, source)
                return render("retry", base_url=self._config.base_url, mac=mac, seconds=10,
                              reason="discoveries from this address over their budget")
            self._discoveries.done(source)
        node = await self._discovery.ensure_node(mac, flavour.value)
        if node is None:
            return render("retry", base_url=self._config.base_url, mac=mac, seconds=10,
                          reason="discovery rate exceeded")
        if node.state is NodeState.SERVICING:  # the step's record, as it wrote it last
            node = await self._discovery.current(node)
        purpose = _NETBOOT_STATES.get(node.state) or _servicing_netboot(node)
        if purpose is not None and not node.maintenance:
            try:  # the script carries the node's token: only to the node's leased address
                await self._agents.check_boot_source(node, request.remote)
            except SourceRefused as exc:
                raise _problem(403, str(exc)) from None
        if purpose is None or node.maintenance:
            reason = "in maintenance" if node.maintenance else f"node is {node.state}"
            log.info("node %s: served local boot (%s)", node.id, reason)
            return render("local", reason=reason)
        if purpose == "deploy" and await self._agents.image_written(node.id):
            log.info("node %s: image written; served local boot", node.id)
            return render("local", reason="image written, boot disk")
        token = await self._agents.issue_token(node.id)
        if purpose == "deploy" and self._installer is not None and \
                (script := await self._installer.script(node, token, mac,
                                                        grub=flavour is _Flavour.GRUB)):
            return script  # the profile uses an installer, not the agent
        log.info("node %s: served %s %s to %s", node.id, purpose, flavour.label, mac)
        cfg = self._config
        kernel, initrd, args = (cfg.kernel, cfg.initrd, cfg.kernel_args) \
            if flavour is _Flavour.IPXE else \
            (cfg.kernel_arm64, cfg.initrd_arm64, cfg.kernel_args_arm64)
        return render("agent", purpose=purpose, node_id=node.id, mac=mac,
                      base_url=cfg.base_url, kernel=kernel, initrd=initrd, kernel_args=args,
                      kernel_url=f"{cfg.base_url}/artefacts/{kernel}",
                      initrd_url=f"{cfg.base_url}/artefacts/{initrd}", token=token)

    # -- files --------------------------------------------------------------------------------

    async def artefact(self, request: web.Request) -> web.FileResponse:
        return self._file(_jailed(self._config.artefacts_dir, request.match_info["path"]))

    async def asset(self, request: web.Request) -> web.FileResponse:
        return self._file(_jailed(self._config.assets_dir, request.match_info["path"]))

    def _file(self, path: Path) -> web.FileResponse:
        if self._sendfile is None:
            return web.FileResponse(path, chunk_size=256 * 1024)
        return self._sendfile.file(path)

    async def _close(self, _app: web.Application) -> None:
        if self._sendfile is not None:
            self._sendfile.close()

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

    async def agent_seed(self, request: web.Request) -> web.Response:
        """The cloud-init seed of the node's pending deploy (``?generation=``), as bytes."""
        node_id = await self._authenticate(request)
        seed = self._agents.seed(node_id, request.query.get("generation", ""))
        if seed is None:
            raise web.HTTPNotFound(text="no pending deploy with a seed for this node")
        return web.Response(body=seed, content_type="application/octet-stream")

    async def agent_callback(self, request: web.Request) -> web.Response:
        """``{"event": "booted" | "installed", "hostname": ...}`` from the deployed OS (its
        cloud-init seed) or from an installer's last step."""
        node_id = await self._authenticate(request)
        body = await _json_body(request)
        try:
            waited = await self._agents.callback(node_id, body, remote=request.remote)
        except InvalidRequest as exc:
            raise _problem(422, str(exc)) from None
        # the history row (bounded per node: ``RowBudget``) is the record; a line per call
        # only for the one a step waited for
        log.log(logging.INFO if waited else logging.DEBUG, "node %s: OS callback %s "
                "(hostname %r)%s", node_id, body.get("event"), body.get("hostname"),
                "" if waited else "; no step was waiting")
        return web.json_response({"recorded": True, "waiting": waited})

    async def agent_fabric(self, request: web.Request) -> web.Response:
        """``{"fabric": NAME, "ibnetdiscover": TEXT}`` from one node per fabric (the Ansible
        ``facts`` role). Bigger than other agent bodies: read here, under its own cap."""
        info = await self._token(request)
        assert self._fabrics is not None and info.node_id is not None
        try:  # before the body is read: a refused post costs no more than its head
            await self._fabrics.entitle(info, request.remote)
        except FabricRefused as exc:
            raise _problem(403, str(exc)) from None
        if self._fabric_posts.admit(info.node_id) is not None:
            raise _problem(429, f"fabric scans of node {info.node_id} over their budget "
                           f"(one at a time, {FABRIC_SCAN_BURST} in a row, then one per "
                           f"{1 / FABRIC_SCANS_PER_S:.0f} s)", retry_after=60)
        try:
            return await self._fabric(request, info.node_id)
        finally:
            self._fabric_posts.done(info.node_id)

    async def agent_health(self, request: web.Request) -> web.Response:
        """The in-band probe's evidence (``lifecycle.inband``): a probe token, from the
        node's own address, a bounded body; the node is the token's, never the body's."""
        assert self._inband is not None
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        info = await self._inband.authenticate(token) if scheme == "Bearer" and token \
            else None
        if info is None:
            raise _problem(401, "missing, expired or invalid probe token")
        try:
            body = await _json_body(request, await _capped_body(request, MAX_PROBE_BYTES))
            return web.json_response(await self._inband.accept(info, request.remote, body))
        except ProbeRefused as exc:
            log.warning("in-band post refused: %s", exc)
            raise _problem(403, str(exc)) from None
        except ProbeTooSoon as exc:
            raise _problem(429, str(exc), retry_after=max(1, round(exc.retry_after_s))) \
                from None
        except InvalidRequest as exc:
            raise _problem(422, str(exc)) from None

    async def _fabric(self, request: web.Request, node_id: str) -> web.Response:
        assert self._fabrics is not None
        body = await _json_body(request, await _capped_body(request, self._max_fabric_bytes))
        fabric, text = body.get("fabric", DEFAULT_FABRIC), body.get("ibnetdiscover")
        if not isinstance(fabric, str):
            raise _problem(422, "fabric: must be a string")
        if not isinstance(text, str) or not text.strip():
            raise _problem(422, "ibnetdiscover: must be the tool's output, a non-empty string")
        try:
            accepted = await self._fabrics.report(node_id, fabric, text)
        except InvalidRequest as exc:
            log.warning("node %s: fabric scan refused: %s", node_id, exc)
            raise _problem(422, str(exc)) from None
        log.info("node %s: fabric %s scan accepted (%d switches, %d CAs)", node_id,
                 accepted.fabric, accepted.switches, accepted.cas)
        return web.json_response({"accepted": True, "fabric": accepted.fabric,
                                  "switches": accepted.switches, "cas": accepted.cas,
                                  "links": accepted.links, "sha256": accepted.sha256})

    async def _authenticate(self, request: web.Request) -> str:
        info = await self._token(request)
        assert info.node_id is not None
        return info.node_id

    async def _token(self, request: web.Request) -> TokenInfo:
        """The call's agent token, checked against its binding (401, 403)."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        info = await self._tokens.lookup(token) if scheme == "Bearer" and token else None
        if info is None or info.role is not Role.AGENT or info.node_id is None \
                or is_probe_token(info):  # a probe token is for /agent/v1/health alone
            log.warning("agent call %s from %s refused: missing or invalid token",
                        request.path, request.remote)
            raise _problem(401, "missing, expired or invalid agent token")
        try:
            await self._agents.check_source(info, token, request.remote,
                                            local=_local_address(request))
        except SourceRefused as exc:
            raise _problem(403, str(exc)) from None
        return info


def _script(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/plain")


_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden,
    422: web.HTTPUnprocessableEntity, 429: web.HTTPTooManyRequests}


def _problem(status: int, detail: str, *, retry_after: int | None = None
             ) -> web.HTTPException:
    error_class = _ERRORS[status]
    body = json.dumps({"title": error_class().reason, "status": status, "detail": detail})
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return error_class(text=body, content_type="application/problem+json", headers=headers)


async def _capped_body(request: web.Request, limit: int) -> bytes:
    """The whole body, however the client cut it into packets or chunks, refused (413) past
    ``limit`` bytes whatever Content-Length claims. (One ``read(limit + 1)`` returns what has
    arrived so far: a large post would be cut short.)"""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit, request.content_length)
    data = bytearray()
    while len(data) <= limit:
        chunk = await request.content.read(limit + 1 - len(data))
        if not chunk:  # the end of the body
            return bytes(data)
        data += chunk
    raise _too_large(limit, len(data))


def _too_large(limit: int, size: int) -> web.HTTPException:
    body = json.dumps({"title": "Request Entity Too Large", "status": 413,
                       "detail": f"body larger than {limit} bytes"})
    return web.HTTPRequestEntityTooLarge(limit, size, text=body,
                                         content_type="application/problem+json")


async def _json_body(request: web.Request, raw: bytes | None = None) -> dict[str, object]:
    """The JSON object of the body; 400 when it is not JSON or nests deeper than any agent
    body does (``MAX_JSON_DEPTH``: deeper would exhaust the parser's or a later walk's
    recursion limit), 422 when it is not an object."""
    try:
        body = json.loads(raw if raw is not None else await request.read())
    except RecursionError:
        raise _problem(400, f"body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:
        raise _problem(400, "body is not valid JSON") from None
    if json_depth(body) > MAX_JSON_DEPTH:
        raise _problem(400, f"body nests deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(body, dict):
        raise _problem(422, "body must be a JSON object")
    return body


def json_depth(value: object) -> int:
    """How deep containers nest in a parsed JSON value (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _jailed(root: Path, relative: str) -> Path:
    """A file under ``root``; traversal, absolute paths and links out of it are 404."""
    base = root.resolve()
    try:
        target = (base / relative).resolve()
        found = target.is_relative_to(base) and target.is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte: no such file either
        found = False
    if not found:
        raise web.HTTPNotFound(text=f"no such file: {relative[:200]}")
    return target
