"""``/ui/nodes/<hostname>``: one node (identity, BMC without secrets, facts, validation,
history, current step, the why-not-schedulable chain) and the operator's actions.

An action is two POSTs: the first shows what will be done and asks to confirm (works
without JavaScript), the second (``confirm=yes``) runs it through the same conductor calls
as the REST API (``api.nodes._apply``, ``Conductor.power``, ``Conductor.set_boot_device``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlencode

from aiohttp import web

from provisioner.api import CONDUCTOR, NODES, actor
from provisioner.api.nodes import ACTIONS, allowed_actions, apply_action
from provisioner.api.power import via_bmc
from provisioner.api.ui import ENV
from provisioner.api.ui.auth import FormData, form, page, refuse
from provisioner.api.ui.facts import sections
from provisioner.api.ui.render import html, node_ref
from provisioner.api.ui.session import Session
from provisioner.api.why import explain_node
from provisioner.bmc.base import BootDevice, PowerAction
from provisioner.domain import Node, Role
from provisioner.errors import Conflict, InvalidRequest, NotFound
from provisioner.lifecycle.validation import report_of
from provisioner.validation.record import ValidationRecord

POWER_ACTIONS: Final = ("on", "off", "soft-off", "cycle", "status")
BOOT_DEVICES: Final = ("pxe", "disk", "http", "bios")
_MAX_REASON: Final = 1024


async def _find(request: web.Request) -> Node:
    key = request.match_info["node"]
    if "\x00" in key or key.encode("utf-8", "replace").decode() != key:
        raise NotFound("node", key)
    return await request.app[NODES].find(key)


@page
async def node_page(request: web.Request, session: Session) -> web.Response:
    try:
        node = await _find(request)
    except NotFound as exc:
        return refuse(request, 404, str(exc))
    history = await request.app[NODES].history(node.id)
    answer = await explain_node(request.app, node)  # the API's and the CLI's answer too
    record = ValidationRecord.from_facts(node.facts)
    context = {
        "session": session, "node": node, "ref": node_ref(node.hostname, node.id),
        "history": list(reversed(history)), "chain": answer.chain,
        "holds": answer.holds, "schedulable": answer.schedulable,
        "step_status": request.app[CONDUCTOR].step_status(node.id),
        "validation": record, "facts": sections(node.facts),
        "report": sections(report_of(node.facts)) if "last_report" in node.facts else [],
        "actions": allowed_actions(node), "can_act": session.role.allows(Role.OPERATOR),
        "power_actions": POWER_ACTIONS, "boot_devices": BOOT_DEVICES,
        "done": request.query.get("done", "")[:200],
        "failed": request.query.get("failed", "")[:500],
    }
    return html(request.app[ENV], "node.html.j2", context)


async def _act(request: web.Request, session: Session, data: FormData) -> web.StreamResponse:
    kind = request.match_info["kind"]
    try:
        node = await _find(request)
    except NotFound as exc:
        return refuse(request, 404, str(exc))
    fields, summary = _describe(kind, data)
    if summary is None:
        return refuse(request, 422, fields.get("error", "unknown action"))
    ref = node_ref(node.hostname, node.id)
    if data.get("confirm") != "yes":
        return html(request.app[ENV], "confirm.html.j2", {
            "session": session, "node": node, "ref": ref, "kind": kind, "fields": fields,
            "summary": summary})
    try:
        await _run(request, node, kind, fields)
    except (Conflict, InvalidRequest, web.HTTPBadGateway) as exc:
        text = exc.text if isinstance(exc, web.HTTPException) else str(exc)
        raise web.HTTPSeeOther(f"/ui/nodes/{ref}?" + urlencode(
            {"failed": f"{summary}: {text}"})) from None
    raise web.HTTPSeeOther(f"/ui/nodes/{ref}?" + urlencode({"done": summary}))


act = form(_act, role=Role.OPERATOR)


def _describe(kind: str, data: FormData) -> tuple[dict[str, str], str | None]:
    """The form's fields for this kind of action and a one-line summary; None: invalid."""
    if kind == "action":
        name = data.get("action", "")
        reason = " ".join(data.get("reason", "").split())[:_MAX_REASON]
        if name not in ACTIONS:
            return {"error": f"unknown action {name[:40]!r}"}, None
        if name == "maintenance-on" and not reason:
            return {"error": "maintenance-on needs a reason"}, None
        return {"action": name, "reason": reason}, name + (f" ({reason})" if reason else "")
    if kind == "power":
        action = data.get("power", "")
        if action not in POWER_ACTIONS:
            return {"error": f"unknown power action {action[:40]!r}"}, None
        return {"power": action}, f"power {action}"
    if kind == "bootdev":
        device = data.get("device", "")
        persistent = "yes" if data.get("persistent") == "yes" else "no"
        if device not in BOOT_DEVICES:
            return {"error": f"unknown boot device {device[:40]!r}"}, None
        how = "persistent" if persistent == "yes" else "next boot only"
        return {"device": device, "persistent": persistent}, f"boot device {device} ({how})"
    return {"error": f"unknown kind {kind[:40]!r}"}, None


async def _run(request: web.Request, node: Node, kind: str, fields: Mapping[str, str]) -> Any:
    conductor = request.app[CONDUCTOR]
    who = actor(request)
    if kind == "action":
        return await apply_action(conductor, node.id, fields["action"], actor=who,
                            reason=fields["reason"])
    if kind == "power":
        return await via_bmc(node, conductor.power(node.id, PowerAction(fields["power"]),
                                                actor=who))
    return await via_bmc(node, conductor.set_boot_device(
        node.id, BootDevice(fields["device"]), persistent=fields["persistent"] == "yes",
        uefi=True, actor=who))
