"""Seeds a simulated rack: N fake-BMC nodes enrolled at start when the store has none."""

from __future__ import annotations

from provisioner.config import SimulationSettings
from provisioner.domain import BmcEndpoint, NewNode, NodeState


def simulated_nodes(settings: SimulationSettings) -> list[NewNode]:
    nodes: list[NewNode] = []
    per_rack = -(-settings.nodes // settings.racks)
    for index in range(settings.nodes):
        rack, slot = divmod(index, per_rack)
        name = f"sim-r{rack + 1:02d}-n{slot + 1:03d}"
        serial = f"SIM{index + 1:06d}"
        nodes.append(NewNode(
            state=NodeState.ENROLLED, hostname=name, serial=serial,
            macs=(f"02:00:00:{(index >> 16) & 0xff:02x}:{(index >> 8) & 0xff:02x}:"
                  f"{index & 0xff:02x}",),
            profile=settings.profile, rack=f"r{rack + 1:02d}", position=f"u{slot + 1}",
            bmc=BmcEndpoint(driver="fake", address=serial, username="admin",
                            password_set=True),
            bmc_password="simulated",
        ))
    return nodes
