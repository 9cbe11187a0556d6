"""Prometheus metrics: one registry per daemon, owned by ``Metrics`` and passed explicitly.

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
    """``provisioner_nodes{state}`` from the counts of the last ``refresh``; 0 when absent."""

    def __init__(self) -> None:
        self.counts: Mapping[str, int] = {}

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily("provisioner_nodes", "Nodes per lifecycle state",
                                   labels=["state"])
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
    """``provisioner_firmware_nodes{status,profile}``: nodes per firmware drift status
    (conforming, drifted, updating, failed, unknown) per profile with a firmware baseline,
    from the counts of the last ``refresh_firmware``."""

    _NAME, _HELP = ("provisioner_firmware_nodes",
                    "Nodes per firmware status against their profile's baseline")

    def __init__(self) -> None:
        self.counts: Mapping[tuple[str, str], int] = {}

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._NAME, self._HELP, labels=["status", "profile"])
        for (status, profile), count in sorted(self.counts.items()):
            family.add_metric([status, profile], float(count))
        yield family

    def describe(self) -> Iterator[Any]:
        yield GaugeMetricFamily(self._NAME, self._HELP, labels=["status", "profile"])


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
        """Re-read the node counts; call before ``render``."""
        self._nodes.counts = dict(await repo.count_by_state())

    async def refresh_health(self, repo: FindingCounter) -> None:
        """Re-read the open findings per class; call before ``render``."""
        self._findings.counts = dict(await repo.open_counts())

    def refresh_firmware(self, counts: Mapping[tuple[str, str], int]) -> None:
        """(status, profile) -> nodes, as ``lifecycle.drift.counts`` reads them."""
        self._firmware.counts = dict(counts)

    def render(self) -> bytes:
        data: bytes = generate_latest(self._registry)
        return data
