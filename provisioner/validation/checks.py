"""A node's facts against what its profile expects: GPU count and model, InfiniBand ports
Active at the expected rate, the NVLink fabric (GFD's rule), the DCGM diagnostic. Pure.
Whatever the profile: a GPU's own NVSwitch fabric and recovery action (``gpu_fabric``).

Every check returns failure lines that name the check and what was seen against what was
expected; ``evaluate`` runs them all, so a failed node is held out with every reason at once,
not the first one only. Input is a facts report (``provisioner.agent.facts``'s shape); any
shape gives a verdict, never an exception.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.agent.gpu_ids import device_id, matches, model_name
from provisioner.topology.model import (
    GpuReport,
    LinkRate,
    LocalCa,
    LocalPort,
    NvlinkScope,
    PortState,
    TopologyParseError,
    nvlink_domain,
)
from provisioner.topology.parse_nvsmi_xml import parse_nvidia_smi_xml
from provisioner.validation.gpu_fabric import (
    check_recovery,
    fabric_faults,
    gpu_name,
    reports_fabric,
    reports_recovery,
)
from provisioner.validation.hardware import check_disks, check_memory
from provisioner.validation.imex import check_imex
from provisioner.validation.infiniband import (
    NOT_CHECKED_CHECK,
    ib_driver,
    no_driver_failure,
    not_checked_note,
)

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_RATE_TOLERANCE = 0.01  # 1 %: 4X NDR is 400 Gb/s whether it is written 400 or 400.0
_SUMMARY_CHARS = 300
_PCI_ADDRESS = re.compile(r"^([0-9a-f]{1,8}):([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$")


@dataclass(frozen=True, slots=True)
class Expectation:
    """What a profile expects (``[validation.profiles.<name>]``); None/False: not checked."""

    gpu_count: int | None = None
    gpu_model: str | None = None
    ib_rate_gbps: float | None = None
    ib_port_count: int | None = None
    nvlink_domain: bool = False
    nvlink_domain_nodes: int | None = None
    require_dcgm: bool = False
    nvlink_accept_degraded_bandwidth: bool = False
    memory_min_gib: float | None = None
    disk_count: int | None = None
    disk_min_gb: float | None = None
    ib_require_active: bool = True
    imex: str | None = None
    """``dra`` or ``host``: check the GB200/GB300 IMEX prerequisites (``validation.imex``)."""
    """False (the SKU gate at inspection): count and rate only, and a report read without an
    InfiniBand driver is not checked but noted (``validation.infiniband``)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    failures: tuple[str, ...]
    checks: tuple[str, ...]
    clique: str | None = None
    notes: tuple[str, ...] = ()
    """What was not checked and why (``InfiniBand not checked at inspection: no driver``)."""
    settling: bool = False
    """Every failure is the NVSwitch fabric still training (``In Progress``, and what
    cannot run before it is up): worth re-collecting the facts before holding the node."""

    @property
    def passed(self) -> bool:
        return not self.failures


def evaluate(report: Mapping[str, Any], expect: Expectation, hostname: str = "") -> Verdict:
    """Every check the expectation asks for, on one facts report. The NVLink clique is
    reported whenever the GPUs name one (even unasked: a domain is only handed on whole)."""
    failures: list[str] = []
    checks: list[str] = []
    gpus, parse_error = gpu_report(report, hostname)
    if parse_error is not None and (expect.nvlink_domain or expect.gpu_count is not None
                                    or expect.gpu_model is not None):
        failures.append(f"nvidia-smi: {parse_error}")
    if expect.gpu_count is not None or expect.gpu_model is not None:
        checks.append("gpus")
        failures += check_gpus(gpus, _facts_gpus(report), expect)
    lost = check_lost(gpus, report)
    if lost:
        checks.append("gpu-lost")
        failures += lost
    transient: set[str] = set()
    if expect.nvlink_domain:
        checks.append("nvlink-fabric")
        failures += check_fabric(gpus, expect, missing=parse_error is None)
        if gpus is not None:
            transient.update(f.line for f in fabric_faults(gpus, every_gpu=True)
                             if f.transient)
    elif gpus is not None:  # the node's own NVSwitch fabric: asked by the GPUs, not the profile
        faults = fabric_faults(gpus)
        if reports_fabric(gpus):
            checks.append("nvlink-fabric")
        failures += [f.line for f in faults]
        transient.update(f.line for f in faults if f.transient)
        if health := check_fabric_health(gpus, expect):
            checks.append("nvlink-health")  # a sick fabric fails any profile, asked or not
            failures += health
    if gpus is not None and reports_recovery(gpus):
        checks.append("gpu-recovery")
        failures += check_recovery(gpus)
    notes: list[str] = []
    if expect.ib_rate_gbps is not None or expect.ib_port_count is not None:
        check, lines, note = judge_infiniband(report, expect)
        checks.append(check)
        failures += lines
        notes += note
    if expect.memory_min_gib is not None:
        checks.append("memory")
        failures += check_memory(report, expect.memory_min_gib)
    if expect.disk_count is not None or expect.disk_min_gb is not None:
        checks.append("disks")
        failures += check_disks(report, expect.disk_count, expect.disk_min_gb)
    if expect.imex is not None:
        checks.append("imex")
        failures += check_imex(report, expect.imex)
    dcgm = report.get("dcgm_diag")
    if expect.require_dcgm or isinstance(dcgm, Mapping):
        checks.append("dcgm")
        dcgm_failures = check_dcgm(dcgm if isinstance(dcgm, Mapping) else None, expect)
        failures += dcgm_failures
        if transient:  # CUDA (so DCGM) cannot run before the GPUs joined the fabric
            transient.update(dcgm_failures)
    return Verdict(tuple(failures), tuple(checks), _clique(gpus, failed=bool(failures)),
                   tuple(notes), settling=bool(failures) and set(failures) <= transient)


def _clique(gpus: GpuReport | None, *, failed: bool) -> str | None:
    """GFD's clique; for a node that failed, also the one its GPUs merely claim (all name
    the same non-zero ClusterUUID and CliqueId, fabric not done): the rest of that domain
    must learn that one of theirs failed."""
    if gpus is None or not gpus.gpus:
        return None
    domain = nvlink_domain(gpus.gpus)
    if domain.scope is NvlinkScope.MULTI_NODE:
        return domain.clique
    if not failed:
        return None
    claimed = {(g.cluster_uuid.strip().lower(), g.clique_id.strip()) for g in gpus.gpus}
    if len(claimed) != 1:
        return None
    ((uuid, clique),) = claimed
    if not _UUID.match(uuid) or uuid.replace("-", "").strip("0") == "" or not clique.isdigit():
        return None
    return f"{uuid}.{clique}"


def gpu_report(report: Mapping[str, Any], hostname: str = "") -> tuple[GpuReport | None,
                                                                        str | None]:
    """The parsed ``nvidia_smi_xml`` of a report: (report, None), (None, parse error) or
    (None, None) when the report has none (driver not up, or an inspection report)."""
    text = report.get("nvidia_smi_xml")
    if text is None:
        return None, None
    if not isinstance(text, str):
        return None, "nvidia_smi_xml is not text"
    try:
        return parse_nvidia_smi_xml(text, hostname), None
    except TopologyParseError as exc:
        return None, str(exc)


# -- GPUs -----------------------------------------------------------------------------------


def check_gpus(gpus: GpuReport | None, pci_names: Sequence[str | None],
               expect: Expectation) -> list[str]:
    """Count and model. The driver's view (nvidia-smi) wins over PCI: a GPU that fell off
    the bus or failed to initialise is on PCI but not usable. The model matches as whole words
    of the name or of its pci.ids name (``provisioner.agent.gpu_ids.matches``): ``H100``
    matches ``NVIDIA H100 80GB HBM3``, ``H20`` does not match ``NVIDIA H200``."""
    names: list[str | None] = ([g.product for g in gpus.gpus] if gpus is not None
                               else list(pci_names))
    source = "nvidia-smi" if gpus is not None else "PCI"
    failures: list[str] = []
    if expect.gpu_count is not None and len(names) != expect.gpu_count:
        failures.append(f"gpu-count: saw {len(names)} GPUs ({source}), "
                        f"expected {expect.gpu_count}")
    if expect.gpu_model is not None:
        wrong = Counter(name or "(no model name)" for name in names
                        if not name or not matches(expect.gpu_model, name))
        for name, count in sorted(wrong.items()):
            failures.append(f"gpu-model: saw {name!r} on {count} of {len(names)} GPUs "
                            f"({source}), expected a model containing {expect.gpu_model!r}")
    return failures


def _facts_gpus(report: Mapping[str, Any]) -> list[str | None]:
    """The names of the report's ``gpus`` (PCI level: the ramdisk's, or the facts module's
    without a driver); an NVIDIA GPU without a name, or with the pre-table ``NVIDIA 0x2330``,
    is named from its device ID."""
    listed = report.get("gpus")
    if not isinstance(listed, list):
        return []
    return [_pci_name(g) if isinstance(g, Mapping) else None for g in listed]


def _pci_name(gpu: Mapping[str, Any]) -> str | None:
    name = str(gpu.get("name") or "")
    device = str(gpu.get("device") or "")
    nvidia = str(gpu.get("vendor", "")).lower() in ("0x10de", "10de")
    if nvidia and device_id(device) is not None and (
            not name or name.lower() == f"nvidia {device.lower()}"):
        return model_name(device)
    return name or None


def check_fabric(gpus: GpuReport | None, expect: Expectation, *, missing: bool = True
                 ) -> list[str]:
    """GFD's rule on every GPU: fabric state Completed, status Success, a non-zero
    ClusterUUID, all GPUs agreeing. ``missing``: say so when there is no report at all."""
    want = "expected fabric state Completed, status Success and a non-zero ClusterUUID"
    if gpus is None:
        return [f"nvlink-fabric: no nvidia-smi -q -x report (NVIDIA driver not up?), {want}"
                ] if missing else []
    if not gpus.gpus:
        return [f"nvlink-fabric: nvidia-smi lists no GPU, {want}"]
    failures = [f.line for f in fabric_faults(gpus, every_gpu=True)]
    failures += check_fabric_health(gpus, expect)
    domain = nvlink_domain(gpus.gpus)
    if not failures and domain.scope is not NvlinkScope.MULTI_NODE:
        failures.append(f"nvlink-fabric: {domain.reason}, expected a multi-node NVLink "
                        "domain (non-zero ClusterUUID, one CliqueId)")
    return failures


def check_fabric_health(gpus: GpuReport, expect: Expectation) -> list[str]:
    """The ``<fabric><health>`` block (DTD v13) of every GPU: a fabric Completed/Success can
    still be Unhealthy (route unhealthy, incorrect configuration...): held with the reason.
    A degraded bandwidth is held too unless the profile accepts it."""
    failures = []
    for gpu in gpus.gpus:
        if problems := gpu.health.problems():
            failures.append(f"nvlink-fabric: GPU {gpu_name(gpu)}: fabric {', '.join(problems)}"
                            ", expected a healthy NVLink fabric")
        degraded = gpu.health.degraded()
        if degraded and not expect.nvlink_accept_degraded_bandwidth:
            failures.append(f"nvlink-fabric: GPU {gpu_name(gpu)}: fabric {degraded}, expected "
                            "full NVLink bandwidth (the profile does not accept degraded "
                            "bandwidth: nvlink_accept_degraded_bandwidth)")
    return failures


def check_lost(gpus: GpuReport | None, report: Mapping[str, Any]) -> list[str]:
    """GPUs the driver lost: nvidia-smi's own error lines (``Unable to determine the device
    handle for GPU 0000:05:00.0: GPU is lost. Reboot the system to recover this GPU``), and
    NVIDIA GPUs on PCI that nvidia-smi does not list."""
    errors = report.get("nvidia_smi_errors")
    failures = [f"gpu-lost: nvidia-smi: {' '.join(str(line).split())[:_SUMMARY_CHARS]}"
                for line in (errors if isinstance(errors, list) else [])]
    if gpus is None:
        return failures
    listed = {_bus(g.bus_id) for g in gpus.gpus}
    for address in _pci_gpu_addresses(report):
        if _bus(address) not in listed and not any(_bus(address) in f.lower()
                                                   for f in failures):
            failures.append(f"gpu-lost: GPU {address} is on PCI but nvidia-smi does not list "
                            f"it ({len(gpus.gpus)} GPUs listed), expected every GPU usable")
    return failures


def _bus(address: str) -> str:
    """``00000000:17:00.0`` (nvidia-smi) and ``0000:17:00.0`` (sysfs) alike."""
    match = _PCI_ADDRESS.match(address.strip().lower())
    return f"{int(match[1], 16):04x}:{match[2]}" if match else address.strip().lower()


def _pci_gpu_addresses(report: Mapping[str, Any]) -> list[str]:
    listed = report.get("pci")
    if not isinstance(listed, list):
        return []
    return [str(d.get("address", "")) for d in listed if isinstance(d, Mapping)
            and str(d.get("vendor", "")).lower() == "0x10de"
            and str(d.get("class", "")).startswith(("0x0300", "0x0302")) and d.get("address")]


# -- InfiniBand -----------------------------------------------------------------------------


def judge_infiniband(report: Mapping[str, Any], expect: Expectation
                     ) -> tuple[str, list[str], list[str]]:
    """(check name, failures, notes). A report read without an InfiniBand driver is not
    checked at inspection (a note says so) and fails validation naming the driver."""
    driver = ib_driver(report)
    if not driver.loaded and not expect.ib_require_active:
        return NOT_CHECKED_CHECK, [], [not_checked_note(driver)]
    if not driver.loaded and driver.reported:
        return "infiniband", [no_driver_failure(driver, expect.ib_port_count,
                                                expect.ib_rate_gbps)], []
    return "infiniband", check_infiniband(facts_cas(report), expect), []


def check_infiniband(cas: Sequence[LocalCa], expect: Expectation) -> list[str]:
    """Every InfiniBand port (Ethernet ports of the same HCAs are not) Active, LinkUp, at
    ``ib_rate_gbps``; ``ib_port_count`` of them. No port at all fails when IB is expected.
    A port that is not Active is named once, for its state: its rate (a Down port reads
    10 Gb/s) says nothing."""
    ports = [(ca.name, port) for ca in cas for port in ca.ports if _is_ib(port)]
    failures: list[str] = []
    if expect.ib_port_count is not None and len(ports) != expect.ib_port_count:
        names = ", ".join(f"{name}/{port.number}" for name, port in ports) or "none"
        failures.append(f"ib-ports: saw {len(ports)} InfiniBand ports ({names}), "
                        f"expected {expect.ib_port_count}")
    elif not ports and expect.ib_rate_gbps is not None:
        failures.append(f"ib-ports: no InfiniBand port found, expected ports at "
                        f"{expect.ib_rate_gbps:g} Gb/s")
    for name, port in ports:
        physical = port.physical.split(":")[-1].strip()
        if expect.ib_require_active and (port.state is not PortState.ACTIVE or (
                physical and physical.lower() != "linkup")):
            failures.append(f"ib-ports: {name} port {port.number} is {port.state.capitalize()}"
                            f" ({physical or 'physical state unknown'}), expected Active "
                            "(LinkUp)")
            continue  # named once, for its state
        if expect.ib_rate_gbps is not None and _link_up(port, physical) \
                and not _rate_ok(port.rate, expect.ib_rate_gbps):
            seen = f"runs at {_rate_text(port.rate)}" if port.rate else "reports no rate"
            failures.append(f"ib-rate: {name} port {port.number} {seen}, expected "
                            f"{expect.ib_rate_gbps:g} Gb/s")
    return failures


def _link_up(port: LocalPort, physical: str) -> bool:
    """A link that trained has a rate to judge, before a subnet manager made it Active
    (Init, Armed); a Down port has none (sysfs shows its lowest rate, 10 Gb/s)."""
    return port.state in (PortState.INIT, PortState.ARMED, PortState.ACTIVE) or (
        physical.lower() == "linkup")


def _is_ib(port: LocalPort) -> bool:
    """InfiniBand unless the port says Ethernet (older reports carry no link layer)."""
    return port.link_layer.strip().lower() != "ethernet"


def _rate_ok(rate: LinkRate | None, want: float) -> bool:
    """In the unit ibstat and sysfs print (``LinkRate.nominal_gbps``): 4X QDR is 40, 4X FDR
    56, whichever collector read the port."""
    return rate is not None and abs(rate.nominal_gbps - want) <= want * _RATE_TOLERANCE


def _rate_text(rate: LinkRate) -> str:
    named = f" ({rate})" if rate.width is not None else ""
    return f"{rate.nominal_gbps:g} Gb/s{named}"


def facts_cas(report: Mapping[str, Any]) -> tuple[LocalCa, ...]:
    """The report's ``infiniband`` HCAs as topology records. An HCA listed without ports
    (an older or simulated report) stands for its one port, with the HCA's state and rate."""
    listed = report.get("infiniband")
    if not isinstance(listed, list):
        return ()
    cas: list[LocalCa] = []
    for hca in listed:
        if not isinstance(hca, Mapping):
            continue
        raw_ports = hca.get("ports")
        if isinstance(raw_ports, list) and raw_ports:
            ports = tuple(_port(p) for p in raw_ports if isinstance(p, Mapping))
        else:
            rate = hca.get("rate_gbps")
            ports = (LocalPort(1, PortState.parse(str(hca.get("state", ""))), "",
                               LinkRate.nominal(float(rate)) if isinstance(rate, int | float)
                               and not isinstance(rate, bool) else None),)
        cas.append(LocalCa(str(hca.get("device", "?")), ports))
    return tuple(cas)


def _port(raw: Mapping[str, Any]) -> LocalPort:
    number = raw.get("port")
    return LocalPort(
        number if isinstance(number, int) and not isinstance(number, bool) else 0,
        PortState.parse(str(raw.get("state", ""))), str(raw.get("phys_state", "")),
        LinkRate.from_sysfs(str(raw.get("rate", ""))),
        link_layer=str(raw.get("link_layer", "")))


# -- DCGM -----------------------------------------------------------------------------------


def check_dcgm(dcgm: Mapping[str, Any] | None, expect: Expectation) -> list[str]:
    """A diagnostic that ran and failed always fails the node; one that did not run fails it
    only when the profile requires it."""
    ran = dcgm is not None and dcgm.get("ran") is True
    summary = " ".join(str(dcgm.get("summary", "")).split())[:_SUMMARY_CHARS] if dcgm else ""
    level = dcgm.get("level") if dcgm is not None else None
    level = level if isinstance(level, int) and not isinstance(level, bool) else 1
    if ran and dcgm is not None and dcgm.get("passed") is not True:
        return [f"dcgm: dcgmi diag -r {level} failed: {summary or 'no summary'}, "
                "expected a pass"]
    if not ran and expect.require_dcgm:
        why = f" ({summary})" if summary else " (dcgmi not installed?)"
        return [f"dcgm: no DCGM diagnostic ran{why}, the profile requires a passing "
                "dcgmi diag -r 1"]
    return []
