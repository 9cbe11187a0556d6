"""Power and boot-device handlers: an operator drives a node's BMC directly.

Power and boot need the operator role, BMC password rotation the admin role; all go into
the node's history with the caller as actor, and are refused (409) while a step is in
flight, except ``status``, which only reads. A BMC failure is a 502 whose detail says why
(timeout, wrong password, unsupported).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Final, TypeVar

from aiohttp import web

from provisioner.api import CONDUCTOR, NODES, ROTATION, SLURM, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import (
    BootDeviceOut,
    BootDeviceRequest,
    NodeOut,
    PowerOut,
    PowerRequest,
    node_out,
    parse_json,
    respond,
)
from provisioner.bmc.base import BootDevice, PowerAction
from provisioner.domain import Node, Role
from provisioner.errors import Conflict, DriverError, InvalidRequest, NotFound

log = logging.getLogger(__name__)

T = TypeVar("T")
PREFIX: Final = "/api/v1"


async def node_power(request: web.Request) -> web.Response:
    body = PowerRequest.model_validate(parse_json(await request.read()))
    node = await _node(request)
    if body.action in _STOPS and not body.confirm:
        await _refuse_if_running_jobs(request, node, body.action)
    conductor = request.app[CONDUCTOR]
    node, state = await via_bmc(node, conductor.power(node.id, PowerAction(body.action),
                                                      actor=actor(request)))
    return respond(PowerOut(action=body.action, power_state=state,
                            node=node_out(node, conductor.step_status(node.id))))


_STOPS: Final = frozenset({"off", "soft-off", "cycle"})
_BUSY: Final = frozenset({"ALLOCATED", "MIXED"})


async def _refuse_if_running_jobs(request: web.Request, node: Node, action: str) -> None:
    """409 naming the jobs' node state when Slurm runs jobs on ``node``; a Slurm that does
    not answer refuses too (we cannot tell), unless the request confirms."""
    slurm = request.app.get(SLURM)
    if slurm is None or not node.hostname:
        return
    try:
        found = await slurm.node(node.hostname)
    except DriverError as exc:
        raise Conflict(f"power {action} of node {node.hostname}: Slurm cannot say whether "
                       f"jobs run there ({exc}); confirm with {{\"confirm\": true}} "
                       "(--yes)") from None
    if found is not None and found.state in _BUSY:
        raise Conflict(f"node {node.hostname} runs Slurm jobs (state {found.state_text}): "
                       f"power {action} kills them; drain it first (maintenance-on) or "
                       "confirm with {\"confirm\": true} (--yes)")


async def node_boot_device(request: web.Request) -> web.Response:
    body = BootDeviceRequest.model_validate(parse_json(await request.read()))
    node = await _node(request)
    conductor = request.app[CONDUCTOR]
    node = await via_bmc(node, conductor.set_boot_device(
        node.id, BootDevice(body.device), persistent=body.persistent, uefi=body.uefi,
        actor=actor(request)))
    return respond(BootDeviceOut(device=body.device, persistent=body.persistent,
                                 uefi=body.uefi,
                                 node=node_out(node, conductor.step_status(node.id))))


async def node_bmc_rotate(request: web.Request) -> web.Response:
    node = await _node(request)
    rotation = request.app.get(ROTATION)
    if rotation is None:
        raise InvalidRequest("BMC password rotation is not available in this daemon")
    conductor = request.app[CONDUCTOR]
    who = actor(request)
    await via_bmc(node, conductor.while_idle(
        node.id, "BMC password rotation", lambda idle: rotation.rotate(idle, actor=who)))
    node = await request.app[NODES].get(node.id)
    return respond(node_out(node, conductor.step_status(node.id)))


async def via_bmc(node: Node, call: Awaitable[T]) -> T:
    """A BMC failure is the BMC's, not ours: 502 with the driver's reason (never secrets)."""
    try:
        return await call
    except DriverError as exc:
        log.warning("node %s: BMC request failed: %s", node.id, exc)
        raise web.HTTPBadGateway(text=f"BMC request failed: {exc}") from None


async def _node(request: web.Request) -> Node:
    key = request.match_info["id"]
    if "\x00" in key or key.encode("utf-8", "replace").decode() != key:
        raise NotFound("node", key)
    return await request.app[NODES].find(key)


_ID: Final = ("id", "node id, hostname, serial or MAC address")
_ERRORS: Final = (400, 404, 409, 413, 422, 502)

ROUTES: Final = (
    Route("POST", f"{PREFIX}/nodes/{{id}}/power", node_power,
          "Power a node on, off (soft-off: ACPI) or cycle it through its BMC, confirmed by "
          "read-back, or read it (status); 409 while a step runs, except status",
          Role.OPERATOR, PowerOut, body=PowerRequest, path_params=(_ID,), errors=_ERRORS),
    Route("POST", f"{PREFIX}/nodes/{{id}}/bmc/rotate", node_bmc_rotate,
          "Rotate the node's BMC password: a new per-node password (or the site's "
          "bmc.rotation_password) set through the BMC, verified by a fresh login before the "
          "old one is forgotten, stored encrypted; never returned. 409 while a step runs. "
          "Changes a credential: admin only", Role.ADMIN, NodeOut, path_params=(_ID,),
          errors=_ERRORS),
    Route("POST", f"{PREFIX}/nodes/{{id}}/bootdev", node_boot_device,
          "Set a node's boot device (once or persistent, UEFI or legacy) through its BMC; "
          "409 while a step runs", Role.OPERATOR, BootDeviceOut, body=BootDeviceRequest,
          path_params=(_ID,), errors=_ERRORS),
)
