"""Prometheus metrics: one registry per daemon, owned by ``Metrics`` and passed explicitly.

With several daemons on one database (docs/ha.md), the fleet's gauges (``provisioner_nodes``,
``provisioner_health_findings``: counts read from the shared database) are exported by the
one daemon that leads the ``fleet`` singleton, and ``provisioner_fleet_leader`` says which
one that is; so ``sum()`` over the daemons is the fleet, never a multiple of it. The others
render those families without samples. Counters and histograms (transitions, API requests)
and the process families count what each daemon did itself: ``sum()`` adds them up.

prometheus_client is untyped; its objects stay inside this module (``Any`` does not leave it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, Protocol

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

from provisioner import __version__
from provisioner.domain import Node, NodeState

#: the classic text format; ``generate_latest`` writes it whatever the library's default is
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

_REQUEST_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: fault seen at its source → finding: the bar is 60 s (p99) with the default poll periods
_DETECT_BUCKETS_S: Final = (1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
#: ladder start → active or service_required: minutes (a GPU reset) to hours (jobs drained)
_REPAIR_BUCKETS_S: Final = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0,
                            86400.0)


class StateCounter(Protocol):
    """What the node gauge needs from the store (``NodeRepo`` has it)."""

    async def count_by_state(self) -> dict[str, int]: ...


class _NodeCollector:
    """``provisioner_nodes{state}`` from the counts of the last ``refresh``; 0 when absent;
    no series when the last refresh was not the fleet leader's (None)."""

    def __init__(self) -> None:
        self.counts: Mapping[str, int] | None = {}

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily("provisioner_nodes", "Nodes per lifecycle state",
                                   labels=["state"])
        if self.counts is not None:
            for state in NodeState:
                family.add_metric([str(state)], float(self.counts.get(state, 0)))
        yield family

    def describe(self) -> Iterator[Any]:
        # Registering calls describe(); without it the collector is collected at once.
        yield GaugeMetricFamily("provisioner_nodes", "Nodes per lifecycle state",
                                labels=["state"])


class FindingCounter(Protocol):
    """What the health gauge needs from the store (``FindingRepo`` has it)."""

    async def open_counts(self) -> dict[str, int]: ...


class _FindingCollector:
    """``provisioner_health_findings{class}``: open, unsilenced findings per class, from the
    counts of the last ``refresh_health``; no series before the first."""

    _NAME, _HELP = "provisioner_health_findings", "Open (unsilenced) health findings per class"

    def __init__(self) -> None:
        self.counts: Mapping[str, int] | None = None

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._NAME, self._HELP, labels=["class"])
        for cls, count in sorted((self.counts or {}).items()):
            family.add_metric([cls], float(count))
        yield family

    def describe(self) -> Iterator[Any]:
        yield GaugeMetricFamily(self._NAME, self._HELP, labels=["class"])


class _LeaderCollector:
    """``provisioner_fleet_leader``: 1 on the daemon that exports the fleet's gauges."""

    _NAME = "provisioner_fleet_leader"
    _HELP = ("1 on the daemon leading the fleet singleton, which alone exports the fleet's "
             "gauges (provisioner_nodes, provisioner_health_findings); 0 on the others")

    def __init__(self) -> None:
        self.leading: Callable[[], bool] = lambda: True  # one daemon: it is the fleet view

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._NAME, self._HELP)
        family.add_metric([], 1.0 if self.leading() else 0.0)
        yield family

    def describe(self) -> Iterator[Any]:
        yield GaugeMetricFamily(self._NAME, self._HELP)


class _HungCollector:
    """``provisioner_hung_threads{pool}``: threads of a bounded pool held by blocking library
    calls past their watchdog deadline (``provisioner.watchdog``), read at each scrape."""

    _NAME, _HELP = "provisioner_hung_threads", "Pool threads held by calls past their deadline"

    def __init__(self) -> None:
        self.pools: dict[str, Callable[[], int]] = {}

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._NAME, self._HELP, labels=["pool"])
        for pool, hung in sorted(self.pools.items()):
            family.add_metric([pool], float(hung()))
        yield family

    def describe(self) -> Iterator[Any]:
        yield GaugeMetricFamily(self._NAME, self._HELP, labels=["pool"])


class _FirmwareCollector:
    """``provisioner_firmware_nodes{status,profile}``: nodes per drift status (conforming,
    drifted, updating, failed, unknown) against their profile's baseline (firmware, BIOS and
    BMC settings together), from the counts of the last ``refresh_firmware``."""

    _NAME, _HELP = ("provisioner_firmware_nodes",
                    "Nodes per firmware status against their profile's baseline")

    def __init__(self) -> None:
        self.counts: Mapping[tuple[str, str], int] | None = {}

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._NAME, self._HELP, labels=["status", "profile"])
        for (status, profile), count in sorted((self.counts or {}).items()):
            family.add_metric([status, profile], float(count))
        yield family

    def describe(self) -> Iterator[Any]:
        yield GaugeMetricFamily(self._NAME, self._HELP, labels=["status", "profile"])


class _BaselineCollector:
    """``provisioner_baseline_nodes{part,status,profile}``: the same per part (firmware,
    bios, bmc), for the profiles with that part's baseline."""

    _NAME, _HELP = ("provisioner_baseline_nodes",
                    "Nodes per status against each part of their profile's baseline")
    _LABELS = ["part", "status", "profile"]

    def __init__(self) -> None:
        self.counts: Mapping[tuple[str, str, str], int] | None = {}

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._NAME, self._HELP, labels=self._LABELS)
        for labels, count in sorted((self.counts or {}).items()):
            family.add_metric(list(labels), float(count))
        yield family

    def describe(self) -> Iterator[Any]:
        yield GaugeMetricFamily(self._NAME, self._HELP, labels=self._LABELS)


class Metrics:
    def __init__(self, instance: str | None = None) -> None:
        """``instance``: this daemon's id (``provisioner_build_info``), for per-daemon views
        of a fleet of daemons (docs/ha.md)."""
        self._registry: Any = CollectorRegistry(auto_describe=True)
        # process_* (CPU, memory, file descriptors, start time) and python_info, as every
        # prometheus_client exporter has them; python_gc_* from the default registry's own
        ProcessCollector(registry=self._registry)
        PlatformCollector(registry=self._registry)
        self._registry.register(GC_COLLECTOR)
        build: Any = Gauge("provisioner_build_info", "The running daemon: 1, labelled with "
                           "its version and instance", ["version", "instance"],
                           registry=self._registry)
        build.labels(version=__version__, instance=instance or "").set(1)
        self._transitions: Any = Counter(
            "provisioner_transitions_total", "Committed node transitions",
            ["event", "from_state", "to_state"], registry=self._registry,
        )
        self._requests: Any = Histogram(
            "provisioner_api_request_seconds", "REST API request duration",
            ["method", "route", "status"], buckets=_REQUEST_BUCKETS_S, registry=self._registry,
        )
        self._detect: Any = Histogram(
            "provisioner_health_time_to_detect_seconds", "From a fault seen at its source "
            "(where the source says when) to its finding", ["source"],
            buckets=_DETECT_BUCKETS_S, registry=self._registry)
        self._repair: Any = Histogram(
            "provisioner_health_time_to_repair_seconds", "From a repair ladder's start to its "
            "end (passed: active again; service_required; reimage)", ["outcome"],
            buckets=_REPAIR_BUCKETS_S, registry=self._registry)
        self._nodes = _NodeCollector()
        self._registry.register(self._nodes)
        self._hung = _HungCollector()
        self._registry.register(self._hung)
        self._findings = _FindingCollector()
        self._registry.register(self._findings)
        self._firmware = _FirmwareCollector()
        self._registry.register(self._firmware)
        self._baselines = _BaselineCollector()
        self._registry.register(self._baselines)
        self._leader = _LeaderCollector()
        self._registry.register(self._leader)

    def fleet_view(self, leading: Callable[[], bool]) -> None:
        """Export the fleet's gauges only while ``leading()`` (this daemon leads the fleet
        singleton); without a call, always (one daemon, or an app under test)."""
        self._leader.leading = leading

    def watch_pool(self, pool: str, hung: Callable[[], int]) -> None:
        """Export ``hung()`` (a watchdog's abandoned threads) as ``provisioner_hung_threads``:
        a pool that stays exhausted needs an operator."""
        self._hung.pools[pool] = hung

    def observe_transition(self, node: Node, event: str, before: NodeState) -> None:
        """The conductor's ``Observer``: count one committed transition."""
        self._transitions.labels(event=event, from_state=str(before),
                                 to_state=str(node.state)).inc()

    def observe_detect(self, source: str, seconds: float) -> None:
        """A finding opened ``seconds`` after its source saw the fault
        (``lifecycle.health.HealthFindings(detected=...)``)."""
        self._detect.labels(source=str(source)).observe(seconds)

    def observe_repair(self, outcome: str, seconds: float) -> None:
        """A repair ladder ended (``lifecycle.repair.repair_timer``)."""
        self._repair.labels(outcome=outcome).observe(seconds)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self._requests.labels(method=method, route=route, status=str(status)).observe(seconds)

    async def refresh(self, repo: StateCounter) -> None:
        """Re-read the node counts (the fleet leader only; no query on the others); call
        before ``render``."""
        self._nodes.counts = dict(await repo.count_by_state()) if self._leader.leading() \
            else None

    async def refresh_health(self, repo: FindingCounter) -> None:
        """Re-read the open findings per class (the fleet leader only); call before
        ``render``."""
        self._findings.counts = dict(await repo.open_counts()) if self._leader.leading() \
            else None

    @property
    def leading(self) -> bool:
        """Whether this daemon exports the fleet's gauges (docs/ha.md, "Metrics")."""
        return self._leader.leading()

    def refresh_firmware(self, counts: Mapping[tuple[str, str], int] | None,
                         parts: Mapping[tuple[str, str, str], int] | None = None) -> None:
        """(status, profile) -> nodes, as ``lifecycle.drift.counts`` reads them, and
        (part, status, profile) -> nodes (``lifecycle.drift.part_counts``); None on a
        daemon that does not lead the fleet (no samples)."""
        self._firmware.counts = dict(counts) if counts is not None else None
        self._baselines.counts = dict(parts) if parts is not None else None

    def render(self) -> bytes:
        data: bytes = generate_latest(self._registry)
        return data
