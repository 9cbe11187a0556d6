"""A domain's acceptance: what each test printed on each node, judged against the class's
floors into one verdict that holds the whole domain and names the slowest node.

Pure: the daemon's launcher (``provisioner/install/acceptance.py``) hands in ``ToolRun``s as
the playbook brought them back; this judges them. A test that did not run on a node (its tool
missing, killed at its deadline, no output at all) is a failed figure of that node, never a
pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from provisioner.acceptance.classes import FabricClass, Floor
from provisioner.acceptance.dcgm_diag import judge_dcgm
from provisioner.acceptance.judge import judge_text
from provisioner.acceptance.mndiag import MndiagRun, judge_mndiag, report
from provisioner.acceptance.model import Figure

#: the tests a profile may ask for, and the tool each runs
TOOLS: Final[Mapping[str, str]] = {"dcgm": "dcgmi", "nvbandwidth": "nvbandwidth",
                                   "nccl": "all_reduce_perf", "ib_write_bw": "ib_write_bw",
                                   "mndiag": "dcgmi"}
FLOOR_KEYS: Final = ("nccl_busbw", "nvbw_host", "nvbw_p2p", "ib_bw")
DOMAIN: Final = "(domain)"  # the "node" a domain-wide test (mpirun, mndiag) ran on
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)")
_TOLERANCE = re.compile(r"x\(1-(\d+(?:\.\d+)?)\)$")
_NOT_FOUND: Final = 127


@dataclass(frozen=True, slots=True)
class ToolRun:
    """One test on one node (or the domain), as the playbook reported it. ``rc`` 127: the
    tool is missing; ``timed_out``: killed at the test's deadline. ``mndiag`` only:
    ``available`` (its probe, ``dcgmi mndiag --help``, exited 0), ``version`` (``dcgmi
    --version``'s words) and ``probe`` (what the probe printed)."""

    node: str
    test: str
    rc: int
    stdout: str
    stderr: str = ""
    timed_out: bool = False
    deadline_s: float = 0.0
    available: bool = True
    version: str = ""
    probe: str = ""


@dataclass(frozen=True, slots=True)
class NodeResult:
    node: str
    figures: tuple[Figure, ...]
    ratio: float | None = None  # its lowest figure / floor; None: no numeric figure

    @property
    def passed(self) -> bool:
        """Every figure passed (a node with no test of its own, under a domain-wide run,
        has none: the domain's figures judge it)."""
        return all(f.passed for f in self.figures)

    def failures(self) -> list[str]:
        return [f"{f.test} {f.figure} {f.value} (floor {f.floor}): {f.reason}"
                for f in self.figures if not f.passed]


@dataclass(frozen=True, slots=True)
class DomainVerdict:
    domain: str
    fabric_class: str
    nodes: tuple[NodeResult, ...]
    slowest: str | None = None
    missing: tuple[str, ...] = field(default=())
    reports: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        judged = any(n.figures for n in self.nodes)
        return judged and not self.missing and all(n.passed for n in self.nodes)

    def summary(self) -> str:
        """One line: passed, or held with the slowest node and the first failures."""
        if self.passed:
            return (f"fabric acceptance of {self.domain} ({self.fabric_class}) passed on "
                    f"{len(self.nodes)} node(s)" + (f"; slowest {self.slowest}"
                                                    if self.slowest else ""))
        failed = [n for n in self.nodes if not n.passed]
        parts = [f"{n.node}: {'; '.join(n.failures()[:2])}" for n in failed[:3]]
        parts += [f"{name}: no result" for name in self.missing]
        slowest = f"slowest {self.slowest}; " if self.slowest else ""
        return (f"fabric acceptance of {self.domain} ({self.fabric_class}) failed on "
                f"{len(failed) + len(self.missing)} of {len(self.nodes) + len(self.missing)}"
                f": {slowest}{' | '.join(parts)}")

    def to_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "fabric_class": self.fabric_class,
                "passed": self.passed, "summary": self.summary(), "slowest": self.slowest,
                "missing": list(self.missing),
                "reports": {name: dict(kept) for name, kept in self.reports.items()},
                "nodes": [{"node": n.node, "passed": n.passed, "ratio": n.ratio,
                           "figures": [figure_json(f) for f in n.figures]}
                          for n in self.nodes]}


def figure_json(figure: Figure) -> dict[str, Any]:
    return {"test": figure.test, "figure": figure.figure, "value": figure.value,
            "floor": figure.floor, "passed": figure.passed, "reason": figure.reason}


def with_overrides(cls: FabricClass, *, tolerance: float | None,
                   floors: Mapping[Any, float], source: str) -> FabricClass:
    """The class with a profile's tolerance and floor values (``FLOOR_KEYS``)."""
    if tolerance is not None:
        cls = cls.with_tolerance(tolerance)
    for key, value in floors.items():
        if key not in FLOOR_KEYS:
            raise ValueError(f"unknown floor {key!r}; one of {', '.join(FLOOR_KEYS)}")
        old: Floor | None = getattr(cls, key)
        unit = old.unit if old is not None else ("Gb/s" if key == "ib_bw" else "GB/s")
        floor = Floor(value, unit, old.tolerance if old is not None else 0.0, source)
        cls = (replace(cls, nccl_busbw=floor) if key == "nccl_busbw" else
               replace(cls, nvbw_host=floor) if key == "nvbw_host" else
               replace(cls, nvbw_p2p=floor) if key == "nvbw_p2p" else
               replace(cls, ib_bw=floor))
    return cls


def scope_of(nccl_scope: str | None, class_gpus: int | None) -> str:
    """``node`` or ``domain``: where all_reduce_perf runs; unset: over the domain for a class
    of more than 8 GPUs (NVL72), else on each node (HGX)."""
    if nccl_scope is not None:
        return nccl_scope
    return "domain" if class_gpus is not None and class_gpus > 8 else "node"


def judge_run(cls: FabricClass, run: ToolRun, *, mndiag_required: bool = False
              ) -> list[Figure]:
    """One test's figures on one node; a test that did not run is one failed figure."""
    if run.timed_out:
        return [Figure(run.test, "deadline", "killed", f"{run.deadline_s:g}s", False,
                       f"{TOOLS.get(run.test, run.test)} still running at its deadline: "
                       "killed on every node it started on")]
    if run.rc == _NOT_FOUND:
        return [Figure(run.test, "tool", "missing", "-", False,
                       f"{TOOLS.get(run.test, run.test)} not found on the node: "
                       f"{(run.stderr.strip() or 'exit status 127')[:200]}")]
    if run.test == "mndiag":
        return [judge_mndiag(MndiagRun(run.rc, run.stdout, run.stderr, run.available,
                                       run.version, run.probe), required=mndiag_required)]
    if run.test == "dcgm":
        verdict = judge_dcgm(run.rc, run.stdout, run.stderr)
        ok = bool(verdict["ran"]) and bool(verdict["passed"])
        return [Figure("dcgmi-diag", "verdict", "pass" if ok else "fail", "-", ok,
                       str(verdict["summary"]))]
    figures = judge_text(cls, run.stdout, run.test)
    if run.rc != 0:
        figures.append(Figure(run.test, "exit", str(run.rc), "0", False,
                              f"{TOOLS.get(run.test, run.test)} exited {run.rc}: "
                              f"{run.stderr.strip()[-200:] or 'no message'}"))
    return figures


def judge_domain(domain: str, cls: FabricClass, nodes: Sequence[str],
                 expected: Mapping[str, Sequence[str]], runs: Iterable[ToolRun], *,
                 mndiag_required: bool = False) -> DomainVerdict:
    """``expected``: node (or ``DOMAIN``) -> the tests that must have run there; one that
    did not report is a failed figure. The slowest node is the one whose lowest figure is
    furthest below (or least above) its floor. ``mndiag``'s output, where it ran, is kept
    verbatim in ``reports`` (not parsed: ``acceptance/mndiag.py``)."""
    by_node: dict[str, dict[str, ToolRun]] = {}
    for run in runs:
        by_node.setdefault(run.node, {})[run.test] = run
    results = []
    for name in [*nodes, *([DOMAIN] if DOMAIN in expected else [])]:
        figures: list[Figure] = []
        for test in expected.get(name, ()):
            found = by_node.get(name, {}).get(test)
            if found is None:
                figures.append(Figure(test, "result", "-", "-", False,
                                      "no result came back: the test did not run"))
            else:
                figures.extend(judge_run(cls, found, mndiag_required=mndiag_required))
        results.append(NodeResult(name, tuple(figures), _ratio(figures)))
    ranked = [r for r in results if r.ratio is not None and r.node != DOMAIN]
    slowest = min(ranked, key=lambda r: r.ratio or 0.0).node if len(ranked) > 1 else None
    mndiag = by_node.get(DOMAIN, {}).get("mndiag")
    reports = ({"mndiag": report(mndiag.stdout)} if mndiag is not None and mndiag.available
               and mndiag.rc != 127 and mndiag.stdout else {})
    return DomainVerdict(domain, cls.name, tuple(results), slowest, reports=reports)


def _ratio(figures: Iterable[Figure]) -> float | None:
    """The lowest value / effective floor over the node's numeric figures."""
    ratios = []
    for figure in figures:
        value, floor = _NUMBER.match(figure.value), _NUMBER.match(figure.floor)
        if value is None or floor is None or float(floor.group(1)) <= 0:
            continue
        tolerance = _TOLERANCE.search(figure.floor)
        effective = float(floor.group(1)) * (1 - float(tolerance.group(1)) if tolerance else 1)
        if figure.figure in ("busbw", "min", "bw_average") and effective > 0:
            ratios.append(float(value.group(1)) / effective)
    return min(ratios) if ratios else None
