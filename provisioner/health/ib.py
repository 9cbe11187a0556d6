"""``ibstat`` (or ``ibstatus``) → findings, through ``provisioner.topology``'s parsers.

A port that is not Active → ``infiniband``, ``drain``, unless its physical state is
``Disabled`` (switched off on purpose: a front-end port left unused). Both link layers are
judged: on a RoCE fabric the ConnectX ports in Ethernet mode are the compute fabric. An Active
port whose rate is below the best rate of the host's other Active ports of the same card type
(``CA type``) and link layer → ``infiniband``, ``drain``: ibstat prints the rate of the link,
not the card's maximum, so the node's own identical cards are the yardstick (a lost lane
shows as NDR 400 → 200).
"""

from __future__ import annotations

from provisioner.health.model import Action, Finding, HealthClass, Source
from provisioner.topology.model import LocalCa, PortState
from provisioner.topology.parse_ibstat import parse_ibstat, parse_ibstatus


def classify_ibstat(text: str) -> list[Finding]:
    cas = parse_ibstatus(text) if "Infiniband device '" in text else parse_ibstat(text)
    return classify_cas(cas)


def classify_cas(cas: tuple[LocalCa, ...]) -> list[Finding]:
    best: dict[tuple[str, str], float] = {}
    for ca in cas:
        for port in ca.ports:
            if port.state is PortState.ACTIVE and port.rate is not None:
                kind = (ca.ca_type, port.link_layer)
                best[kind] = max(best.get(kind, 0.0), port.rate.gbps)
    findings: list[Finding] = []
    for ca in cas:
        for port in ca.ports:
            where, kind = f"{ca.name}/{port.number}", (ca.ca_type, port.link_layer)
            if port.state is not PortState.ACTIVE:
                if port.physical.lower() == "disabled":
                    continue
                findings.append(Finding(
                    HealthClass.INFINIBAND, Action.DRAIN,
                    f"{where}: State: {port.state.value}, Physical state: "
                    f"{port.physical or '?'}, Link layer: {port.link_layer or '?'}",
                    Source.IBSTAT, where))
            elif port.rate is not None and port.rate.gbps < best.get(kind, 0.0):
                findings.append(Finding(
                    HealthClass.INFINIBAND, Action.DRAIN,
                    f"{where}: Rate: {port.rate} below the {best[kind]:g} of the other "
                    f"{ca.ca_type or 'HCA'} {port.link_layer} ports", Source.IBSTAT, where))
    return findings
