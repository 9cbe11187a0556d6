"""The shipped Prometheus alert rules and Grafana dashboard (contrib/) name only metrics the
daemon exports: each name in their PromQL is a sample the daemon's own ``/metrics`` renders
(with a transition, a request, node counts and a finding observed), or Prometheus's ``up``.
``promtool check rules`` runs too where promtool is installed."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from provisioner import __version__
from provisioner.domain import Node, NodeState
from provisioner.ids import NodeId
from provisioner.metrics import Metrics

CONTRIB = Path(__file__).resolve().parents[2] / "contrib"
RULES = CONTRIB / "prometheus" / "provisioner-alerts.yml"
DASHBOARD = CONTRIB / "grafana" / "provisioner-dashboard.json"
PROMETHEUS_OWN = {"up"}
# PromQL words that look like metric names: functions, aggregations, keywords
PROMQL = {"sum", "max", "min", "avg", "count", "rate", "increase", "irate", "by", "without",
          "histogram_quantile", "on", "ignoring", "group_left", "group_right", "and", "or",
          "unless", "bool", "offset", "topk", "bottomk", "label_values", "abs", "clamp_min"}


class _Counts:
    async def count_by_state(self) -> dict[str, int]:
        return {"active": 3, "deploy_failed": 1}

    async def open_counts(self) -> dict[str, int]:
        return {"xid": 1}


def _exported() -> set[str]:
    metrics = Metrics(instance="d0")
    now = datetime.now(UTC)
    node = Node(id=NodeId("n1"), state=NodeState.DEPLOY_FAILED, hostname="gpu-00",
                serial="S1", macs=(), maintenance=False, maintenance_reason="", profile=None,
                rack=None, position=None, facts={}, last_error="", checkpoint=(), version=1,
                history_seq=1, bmc=None, created_at=now, updated_at=now)
    metrics.observe_transition(node, "fail", NodeState.DEPLOYING)
    metrics.observe_request("GET", "/api/v1/nodes", 200, 0.01)
    metrics.watch_pool("install", lambda: 0)
    asyncio.run(metrics.refresh(_Counts()))
    asyncio.run(metrics.refresh_health(_Counts()))
    text = metrics.render().decode()
    assert f'provisioner_build_info{{instance="d0",version="{__version__}"}} 1.0' in text
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def _names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: identifiers not inside a label matcher or a
    string, not followed by ``(`` (a function) and not a PromQL word."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)
    bare = re.sub(r"\[[^]]*\]", "[]", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    found = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare))
    return {n for n in found if n not in PROMQL and not n.startswith("$")
            and not re.fullmatch(r"\d.*|e\d*", n)}


def _rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["query"].replace("label_values(", "").split(",")[0]
              for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_is_exported(source: str) -> None:
    exprs = _rule_exprs() if source == "rules" else _dashboard_exprs()
    assert len(exprs) >= 8
    exported = _exported() | PROMETHEUS_OWN
    named = set().union(*map(_names, exprs))
    assert named, exprs
    assert named <= exported, sorted(named - exported)
    # the fleet's own families are all used somewhere
    assert {"provisioner_nodes", "provisioner_transitions_total"} <= named


def test_the_name_finder_sees_through_promql() -> None:
    assert _names('histogram_quantile(0.99, sum by (route, le) (rate('
                  'provisioner_api_request_seconds_bucket{job=~"$job",status=~"5.."}[5m])))'
                  ) == {"provisioner_api_request_seconds_bucket"}
    assert _names("count(count by (version) (provisioner_build_info)) > 1") == {
        "provisioner_build_info"}


def test_rules_have_a_summary_and_the_dashboard_unique_panel_ids() -> None:
    doc = yaml.safe_load(RULES.read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    assert len({r["alert"] for r in rules}) == len(rules)
    assert all(r["annotations"]["summary"] and r["labels"]["severity"] for r in rules)
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


FLEET_GAUGES = ("provisioner_nodes", "provisioner_health_findings")


def test_a_daemon_not_leading_exports_no_fleet_gauges() -> None:
    """HA (docs/ha.md, "Metrics"): the fleet's counts come from the leader alone, and a
    daemon that does not lead does not even query them."""
    class _Refuses:
        async def count_by_state(self) -> dict[str, int]:
            raise AssertionError("a daemon that does not lead read the node counts")

        async def open_counts(self) -> dict[str, int]:
            raise AssertionError("a daemon that does not lead read the findings")

    leading = False
    metrics = Metrics(instance="d1")
    metrics.fleet_view(lambda: leading)
    asyncio.run(metrics.refresh(_Refuses()))
    asyncio.run(metrics.refresh_health(_Refuses()))
    text = metrics.render().decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert not [line for line in samples if line.startswith(FLEET_GAUGES)]
    assert "# TYPE provisioner_nodes gauge" in text
    assert "provisioner_fleet_leader 0.0" in samples
    leading = True
    asyncio.run(metrics.refresh(_Counts()))
    text = metrics.render().decode()
    assert 'provisioner_nodes{state="active"} 3.0' in text
    assert "provisioner_fleet_leader 1.0" in text


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_fleet_gauges_are_summed_over_daemons(source: str) -> None:
    """Only the leader exports them, so the rules and the dashboard aggregate them with
    ``sum``: the fleet's count whichever daemon leads, one alert rather than one a daemon."""
    exprs = _rule_exprs() if source == "rules" else _dashboard_exprs()
    fleet = [e for e in exprs if _names(e) & set(FLEET_GAUGES)]
    assert fleet
    for expr in fleet:
        assert re.match(r"\s*sum\b", expr), expr
