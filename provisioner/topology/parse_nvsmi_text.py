"""``nvidia-smi -q`` (text) and the CSV query form, plus ``parse_nvidia_smi`` which picks
the parser for any of the three report formats (XML, text, CSV).

Text grammar: indentation nests sections; ``Key<blanks>: value`` pairs; ``GPU <bus id>`` at
column 0 starts a GPU. The fields we need::

    GPU 00000000:19:00.0
        Product Name          : NVIDIA H100 80GB HBM3
        GPU UUID              : GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa
        MIG Mode
            Current           : Disabled
        Fabric
            State             : Completed
            Status            : Success
            CliqueId          : 32766          (drivers >= 550)
            ClusterUUID       : 7f3c2a10-...   (drivers >= 550)
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field

from provisioner.topology.model import FabricHealth, Gpu, GpuReport
from provisioner.topology.parse_common import check_text, fail, guarded, numbered
from provisioner.topology.parse_nvsmi_xml import parse_nvidia_smi_xml

SOURCE = "nvidia-smi -q"
CSV_SOURCE = "nvidia-smi --query-gpu"
DEFAULT_FIELDS = ("index", "uuid", "name", "fabric.state", "fabric.status",
                  "fabric.clusterUuid", "fabric.cliqueId")
_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_PAIR = re.compile(r"^(.*?)\s+:(?:\s+(.*))?$")
_TITLE = re.compile(r"^[A-Za-z][\w ./()+#-]*$")
_FIELDS = {("Product Name",): "product", ("GPU UUID",): "uuid",
           ("MIG Mode", "Current"): "mig", ("Fabric", "State"): "fabric_state",
           ("Fabric", "Status"): "fabric_status", ("Fabric", "CliqueId"): "clique_id",
           ("Fabric", "ClusterUUID"): "cluster_uuid", ("GPU Recovery Action",): "recovery"}
# The text twin of <fabric><health> (DTD v13 names in the values)
_HEALTH: dict[tuple[str, ...], str] = {
           ("Fabric", "Health", "Summary"): "summary",
           ("Fabric", "Health", "Bandwidth"): "bandwidth",
           ("Fabric", "Health", "Route Recovery in progress"): "route_recovery_in_progress",
           ("Fabric", "Health", "Route Unhealthy"): "route_unhealthy",
           ("Fabric", "Health", "Access Timeout Recovery"): "access_timeout_recovery",
           ("Fabric", "Health", "Incorrect Configuration"): "incorrect_configuration",
           ("Fabric", "Health", "Partition Assigned"): "partition_assigned"}


def parse_nvidia_smi(text: str, hostname: str = "", source: str = "nvidia-smi") -> GpuReport:
    """XML, ``-q`` text or ``--query-gpu`` CSV, recognised from the content."""
    check_text(source, text)
    head = text.lstrip()[:200]
    if head.startswith("<"):
        return parse_nvidia_smi_xml(text, hostname, f"{source} (xml)")
    if "NVSMI LOG" in head or any(_GPU.match(line) for _, line in numbered(text[:4096])):
        return parse_nvidia_smi_text(text, hostname, f"{source} (text)")
    return parse_nvidia_smi_csv(text, hostname, source=f"{source} (csv)")


def parse_nvidia_smi_text(text: str, hostname: str = "", source: str = SOURCE) -> GpuReport:
    check_text(source, text)
    return guarded(source, lambda: _Text(source).parse(text, hostname))


@dataclass
class _Text:
    source: str
    gpus: list[dict[str, str | int]] = field(default_factory=list)
    stack: list[tuple[int, str]] = field(default_factory=list)
    top: dict[str, str] = field(default_factory=dict)

    def parse(self, text: str, hostname: str) -> GpuReport:
        for number, line in numbered(text):
            if not line.strip() or line.strip().startswith("====="):
                continue
            self._line(number, line.replace("\t", "    "))
        gpus = tuple(self._gpu(fields, index) for index, fields in enumerate(self.gpus))
        if not gpus:
            raise fail(self.source, 0, "no 'GPU <bus id>' section")
        return GpuReport(hostname, gpus, self.top.get("Driver Version", ""), self.source)

    def _line(self, number: int, line: str) -> None:
        indent = len(line) - len(line.lstrip(" "))
        content = line.strip()
        if indent == 0 and (gpu := _GPU.match(content)) is not None:
            self.gpus.append({"bus_id": gpu[1], "line": number, "mig_devices": 0})
            self.stack = []
            return
        while self.stack and self.stack[-1][0] >= indent:
            self.stack.pop()
        if (pair := _PAIR.match(content)) is not None:
            self._pair(indent, pair[1].strip(), (pair[2] or "").strip())
        elif _TITLE.match(content):
            self.stack.append((indent, content))
            if content == "MIG Device" and self.gpus:
                self.gpus[-1]["mig_devices"] = int(self.gpus[-1]["mig_devices"]) + 1
        else:
            raise fail(self.source, number, f"not an nvidia-smi -q line: {content[:60]!r}")

    def _pair(self, indent: int, key: str, value: str) -> None:
        if not self.gpus or indent == 0:
            self.top[key] = value
            return
        path = (*(name for _, name in self.stack), key)
        if (name := _FIELDS.get(path)) is not None:
            self.gpus[-1][name] = value
        elif (name := _HEALTH.get(path)) is not None:
            self.gpus[-1]["health." + name] = value

    def _gpu(self, fields: dict[str, str | int], index: int) -> Gpu:
        """``index``: the section's place in the report, nvidia-smi's index (not the
        ``Minor Number``, which can differ)."""
        uuid = str(fields.get("uuid", ""))
        if not uuid:
            raise fail(self.source, int(fields["line"]), "GPU section without a GPU UUID")
        health = FabricHealth(**{name: str(fields.get("health." + name, ""))
                                 for name in _HEALTH.values()})
        return Gpu(uuid, str(fields.get("product", "")), str(fields["bus_id"]), index,
                   str(fields.get("fabric_state", "")), str(fields.get("fabric_status", "")),
                   str(fields.get("cluster_uuid", "")), str(fields.get("clique_id", "")),
                   str(fields.get("mig", "")).lower() == "enabled", int(fields["mig_devices"]),
                   health, str(fields.get("recovery", "")))


def parse_nvidia_smi_csv(text: str, hostname: str = "",
                         fields: tuple[str, ...] = DEFAULT_FIELDS,
                         source: str = CSV_SOURCE) -> GpuReport:
    """``--query-gpu=<fields> --format=csv[,noheader]``; with a header row its order wins.
    Needs ``uuid``; ``index``, ``name`` and the ``fabric.*`` fields are optional."""
    check_text(source, text)
    return guarded(source, lambda: _csv(text, hostname, fields, source))


def _csv(text: str, hostname: str, fields: tuple[str, ...], source: str) -> GpuReport:
    rows = [(n, row) for n, row in enumerate(csv.reader(text.splitlines(),
                                                         skipinitialspace=True), start=1) if row]
    if rows and {c.strip().lower() for c in rows[0][1]} & {"uuid", "index"}:
        fields = tuple(c.strip().split(" [")[0] for c in rows[0][1])
        rows = rows[1:]
    names = [f.lower() for f in fields]
    if "uuid" not in names:
        raise fail(source, 0, "the query has no uuid field")
    gpus = []
    for number, row in rows:
        if len(row) != len(names):
            raise fail(source, number, f"{len(row)} columns, expected {len(names)} "
                                       f"({','.join(fields)})")
        cell = dict(zip(names, (c.strip() for c in row), strict=True))
        if not cell["uuid"].startswith(("GPU-", "MIG-")):
            raise fail(source, number, f"not a GPU UUID: {cell['uuid'][:40]!r}")
        index = cell.get("index", "")
        gpus.append(Gpu(cell["uuid"], cell.get("name", ""), cell.get("pci.bus_id", ""),
                        int(index) if index.isdigit() else None,
                        cell.get("fabric.state", ""), cell.get("fabric.status", ""),
                        cell.get("fabric.clusteruuid", ""), cell.get("fabric.cliqueid", "")))
    if not gpus:
        raise fail(source, 0, "no GPU rows")
    return GpuReport(hostname, tuple(gpus), source=source)
