"""A firmware image pushed to a BMC's ``UpdateService.MultipartHttpPushUri`` (issue 25), as
DMTF's Redfish specification (DSP0266, "Multipart HTTP push updates") and OpenBMC's bmcweb
(``redfish-core/lib/update_service.hpp``) take it: one ``multipart/form-data`` POST with a
part named ``UpdateParameters`` (JSON: ``Targets``, and ``@Redfish.OperationApplyTime``
where the service lists it in ``MultipartHttpPushUri@Redfish.OperationApplyTimeSupport``;
``Immediate`` preferred) and a part named ``UpdateFile`` (the image, octet-stream), answered
``202`` with the Task in the body and its monitor in ``Location``.

The image is streamed from its file (aiohttp reads it in chunks off the event loop, with a
``Content-Length``: bmcweb refuses chunked bodies), never read whole into memory; a file
larger than the service's ``MaxImageSizeBytes`` is refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp

from provisioner.bmc.base import BmcUnsupported
from provisioner.bmc.redfish import JsonObject, RedfishClient, _dig
from provisioner.bmc.redfish_errors import _check
from provisioner.errors import FatalError


def apply_time(service: JsonObject) -> str | None:
    offered = _dig(service, "MultipartHttpPushUri@Redfish.OperationApplyTimeSupport",
                   "SupportedValues")
    for wanted in ("Immediate", "OnReset"):
        if isinstance(offered, list) and wanted in offered:
            return wanted
    return None


async def push(client: RedfishClient, service: JsonObject, path: Path,
               targets: list[str]) -> tuple[JsonObject, dict[str, str]]:
    """POST the image; (the answer's body, its headers). Errors: the BMC's, mapped."""
    uri = service.get("MultipartHttpPushUri")
    if not isinstance(uri, str):
        raise BmcUnsupported(f"BMC {client.url}: the UpdateService has no "
                             "MultipartHttpPushUri")
    try:
        image = await asyncio.to_thread(path.open, "rb")
        size = os.fstat(image.fileno()).st_size
    except OSError as exc:
        raise FatalError(f"firmware image {path}: {exc.strerror}") from exc
    limit = service.get("MaxImageSizeBytes")
    if isinstance(limit, int) and size > limit:
        image.close()
        raise BmcUnsupported(f"BMC {client.url}: image {path.name} is {size} bytes, the "
                             f"UpdateService takes at most {limit} (MaxImageSizeBytes)")
    parameters: JsonObject = {"Targets": targets}
    when = apply_time(service)
    if when is not None:
        parameters["@Redfish.OperationApplyTime"] = when
    with image:
        form = aiohttp.MultipartWriter("form-data")
        part = form.append(json.dumps(parameters), {"Content-Type": "application/json"})
        part.set_content_disposition("form-data", name="UpdateParameters")
        part = form.append(image, {"Content-Type": "application/octet-stream"})
        part.set_content_disposition("form-data", name="UpdateFile", filename=path.name)
        status, data, headers = await client.exchange("POST", uri, form=form)
    _check(status, data, client.url, f"POST {uri} ({path.name}, {size} bytes)")
    return data, dict(headers)
