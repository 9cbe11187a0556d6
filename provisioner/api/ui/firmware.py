"""``/ui/firmware``: the fleet's firmware, BIOS and BMC settings against the baselines
(conforming, drifted, updating, failed, unknown per profile), the drifted nodes with each
component's or setting's have and want, and the firmware waves."""

from __future__ import annotations

from aiohttp import web

from provisioner.api import CONDUCTOR, NODES, WAVES
from provisioner.api.ui import ENV
from provisioner.api.ui.auth import page
from provisioner.api.ui.render import html
from provisioner.api.ui.session import Session
from provisioner.lifecycle.drift import by_status, read_fleet
from provisioner.validation.drift import DRIFTED, STATUSES

_MAX_ROWS = 500


@page
async def firmware_page(request: web.Request, session: Session) -> web.Response:
    fleet = await read_fleet(request.app[NODES], request.app[CONDUCTOR].servicing)
    profiles = {p: by_status([f for f in fleet if f.profile == p])
                for p in sorted({f.profile for f in fleet})}
    drifted = [f for f in fleet if f.status == DRIFTED]
    driver = request.app.get(WAVES)
    waves = await driver.repo.list(limit=20) if driver is not None else []
    return html(request.app[ENV], "firmware.html.j2", {
        "session": session, "statuses": STATUSES, "profiles": profiles,
        "totals": by_status(fleet), "drifted": drifted[:_MAX_ROWS],
        "more": max(0, len(drifted) - _MAX_ROWS), "waves": waves})
