"""``nvidia-smi -q -x`` (DTD v12 and v13, with or without MIG).

The XML is parsed with expat directly so that untrusted input cannot expand entities: an
internal DTD subset or any entity declaration is refused (the billion-laughs and external
entity attacks need one), external DTDs and entities are never fetched. A plain
``<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">`` (what nvidia-smi writes) is fine.
"""

from __future__ import annotations

from xml.etree.ElementTree import Element, TreeBuilder
from xml.parsers import expat

from provisioner.topology.model import FabricHealth, Gpu, GpuReport
from provisioner.topology.parse_common import check_text, fail, guarded

SOURCE = "nvidia-smi -q -x"


class _Refused(Exception):
    pass


def safe_xml(text: str, source: str) -> Element:
    """The document's root element, or TopologyParseError (never fetches anything)."""
    builder = TreeBuilder()
    parser = expat.ParserCreate()

    def doctype(name: str, sysid: str | None, pubid: str | None, internal: int) -> None:
        if internal:
            raise _Refused("DTD with an internal subset refused")

    def refuse(*_args: object) -> None:
        raise _Refused("entity declarations refused")

    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = refuse
    parser.UnparsedEntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse  # type: ignore[assignment]
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(text, True)
    except _Refused as exc:
        raise fail(source, parser.CurrentLineNumber, str(exc)) from None
    except expat.ExpatError as exc:
        raise fail(source, exc.lineno, f"not well-formed XML: {expat.ErrorString(exc.code)}"
                   ) from None
    return builder.close()


def parse_nvidia_smi_xml(text: str, hostname: str = "", source: str = SOURCE) -> GpuReport:
    check_text(source, text)
    return guarded(source, lambda: _parse(text, hostname, source))


def _parse(text: str, hostname: str, source: str) -> GpuReport:
    root = safe_xml(text, source)
    if root.tag != "nvidia_smi_log":
        raise fail(source, 1, f"root element is <{root.tag}>, not <nvidia_smi_log>")
    gpus = tuple(_gpu(element, index, source)
                 for index, element in enumerate(root.findall("gpu")))
    return GpuReport(hostname, gpus, _text(root, "driver_version"), source)


def _gpu(element: Element, index: int, source: str) -> Gpu:
    """``index``: the GPU's place in the report, which is nvidia-smi's index (``-q`` lists
    GPUs in index order); ``<minor_number>`` (``/dev/nvidia<minor>``) can differ from it."""
    uuid = _text(element, "uuid")
    if not uuid:
        raise fail(source, 0, f"<gpu id={element.get('id', '?')!r}> has no <uuid>")
    fabric = element.find("fabric")
    return Gpu(
        uuid=uuid, product=_text(element, "product_name"), bus_id=element.get("id", ""),
        index=index, health=_health(fabric),
        fabric_state=_text(fabric, "state"), fabric_status=_text(fabric, "status"),
        cluster_uuid=_text(fabric, "clusterUuid", "cluster_uuid", "clusterUUID"),
        clique_id=_text(fabric, "cliqueId", "clique_id", "cliqueID"),
        mig_enabled=_text(element, "mig_mode/current_mig").lower() == "enabled",
        mig_devices=len(element.findall("mig_devices/mig_device")),
        recovery_action=_text(element, "gpu_recovery_action"))


def _health(fabric: Element | None) -> FabricHealth:
    health = fabric.find("health") if fabric is not None else None
    return FabricHealth(**{name: _text(health, name) for name in FabricHealth.__slots__})


def _text(element: Element | None, *paths: str) -> str:
    if element is None:
        return ""
    for path in paths:
        found = element.find(path)
        if found is not None:
            return (found.text or "").strip()
    return ""
