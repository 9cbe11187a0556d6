"""What Slurm, Kubernetes and Alertmanager say, as health reports (pure mappings): Slurm
states and reasons, Node conditions and allocatable GPUs, and Alertmanager webhook
notifications (a real capture and one built from published dcgm-exporter rules)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from provisioner.errors import InvalidRequest
from provisioner.health.alertmanager import node_name, parse_webhook
from provisioner.health.model import Action, HealthClass
from provisioner.health.records import Report
from provisioner.health.sources import by_words, kube_reports, slurm_reports

H, A = HealthClass, Action
FIXTURES = Path(__file__).parents[1] / "fixtures" / "health"
OWN = ("provisioner: ", "slurm-operator:")
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def classes(reports: list[Report]) -> list[tuple[str, str, str]]:
    return [(r.cls, r.action, r.subject) for r in reports]


@pytest.mark.parametrize(("state", "flags", "reason", "expected"), [
    ("IDLE", set(), "", []),
    ("ALLOCATED", set(), "", []),
    ("IDLE", {"NOT_RESPONDING"}, "", [(H.UNRESPONSIVE, A.RESTART_OS, "slurmd")]),
    ("DOWN", {"NOT_RESPONDING"}, "Not responding", [(H.UNRESPONSIVE, A.RESTART_OS, "slurmd")]),
    ("DOWN", set(), "Not responding", [(H.UNRESPONSIVE, A.RESTART_OS, "slurmd")]),
    # NHC's reasons (its check names) and an operator's words
    ("IDLE", {"DRAIN"}, "NHC: check_hw_ib:  No IB port mlx5_0:1 is ACTIVE (LinkUp 100 Gb/sec)",
     [(H.INFINIBAND, A.DRAIN, "slurm-reason")]),
    ("MIXED", {"DRAIN"}, "NHC: nv_health: GPU 3 Xid 79", [(H.GPU_LOST, A.RESTART_OS,
                                                            "slurm-reason")]),
    ("IDLE", {"DRAIN"}, "bad DIMM B2", [(H.HOST_MEMORY, A.DRAIN, "slurm-reason")]),
    ("IDLE", {"DRAIN"}, "rack maintenance Tuesday", [(H.REPORTED, A.DRAIN, "slurm-reason")]),
    ("DOWN", set(), "ECC errors on GPU 2", [(H.GPU_MEMORY, A.DRAIN, "slurm-reason")]),
    # the daemon's own drains and Slinky's mirror of a cordon are no findings
    ("IDLE", {"DRAIN"}, "provisioner: gpu-lost on GPU 3", []),
    ("IDLE", {"DRAIN"}, "slurm-operator: cordoned", []),
])
def test_slurm_states_and_reasons(state: str, flags: set[str], reason: str,
                                  expected: list[tuple[str, str, str]]) -> None:
    assert classes(slurm_reports(state, flags, reason, "root", OWN)) == expected


def test_slurm_evidence_names_state_reason_and_who() -> None:
    [report] = slurm_reports("IDLE", {"DRAIN"}, "NHC: check_fs_mount: /scratch not mounted",
                             "root", OWN)
    assert report.evidence == ("Slurm: drained by root (IDLE+DRAIN): NHC: check_fs_mount: "
                               "/scratch not mounted")


def cond(kind: str, status: str, reason: str = "", message: str = "",
         ago_s: float = 600) -> tuple[str, str, str, str, datetime | None]:
    return (kind, status, reason, message, NOW - timedelta(seconds=ago_s))


def test_kube_conditions_and_gpus() -> None:
    healthy = [cond("Ready", "True", "KubeletReady"), cond("MemoryPressure", "False"),
               cond("KernelDeadlock", "False", "KernelHasNoDeadlock")]
    assert kube_reports(healthy, now=NOW, grace_s=60, allocatable_gpus=8, gpu_count=8) == []
    sick = [cond("Ready", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."),
            cond("MemoryPressure", "True"),  # the kubelet's own: evicts pods, no finding
            # node-problem-detector's conditions (its default config's reasons)
            cond("KernelDeadlock", "True", "DockerHung", "task docker:7 blocked for more than "
                 "120 seconds."),
            cond("ReadonlyFilesystem", "True", "FilesystemIsReadOnly",
                 "Node condition FilesystemIsReadOnly is now: True")]
    found = classes(kube_reports(sick, now=NOW, grace_s=60, allocatable_gpus=7, gpu_count=8))
    assert found == [(H.UNRESPONSIVE, A.RESTART_OS, "kubelet"),
                     (H.HARDWARE, A.DRAIN, "condition/KernelDeadlock"),
                     (H.HARDWARE, A.DRAIN, "condition/ReadonlyFilesystem"),
                     (H.GPU_LOST, A.RESET_GPU, "nvidia.com/gpu")]


def test_kube_not_ready_within_grace_is_no_finding() -> None:
    young = [cond("Ready", "False", "KubeletNotReady", ago_s=10)]
    assert kube_reports(young, now=NOW, grace_s=60, allocatable_gpus=None, gpu_count=8) == []


@pytest.mark.parametrize(("text", "expected"), [
    ("Xid 48 on GPU 0", (H.GPU_MEMORY, A.RESET_GPU)),
    ("NVLink link 3 down", (H.NVLINK, A.DRAIN)),
    ("coolant leak detected", (H.LEAK, A.DRAIN)),
    ("PSU 2 failed", (H.POWER, A.DRAIN)),
    ("", (H.REPORTED, A.DRAIN)),
])
def test_reason_words(text: str, expected: tuple[str, str]) -> None:
    assert by_words(text) == expected


@pytest.mark.parametrize(("labels", "expected"), [
    ({"node": "gpu-001", "instance": "10.0.0.1:9400"}, "gpu-001"),
    ({"instance": "gpu-001.example:9400"}, "gpu-001.example"),
    ({"instance": "gpu-001"}, "gpu-001"),
    ({"instance": "[2001:db8::1]:9400"}, "2001:db8::1"),
    ({"Hostname": "gpu-002"}, "gpu-002"),
    ({"job": "x"}, None),
])
def test_alert_node_name(labels: dict[str, str], expected: str | None) -> None:
    assert node_name(labels) == expected


def test_real_alertmanager_notification() -> None:
    payload = json.loads((FIXTURES / "alertmanager-webhook-v4-resolved-kube-state-metrics.json")
                         .read_text())
    [alert] = parse_webhook(payload)
    assert (alert.node, alert.firing) == ("192.168.69.53", False)
    assert alert.report.cls is H.REPORTED and alert.report.action is A.NONE  # a warning
    assert alert.report.evidence == ("Deployment (warning): Kubernetes Deployment Replicas "
                                     "Mismatch: Deployment Replicas mismatch, desired value "
                                     "does not match..")


def test_dcgm_exporter_alerts() -> None:
    payload = json.loads((FIXTURES / "alertmanager-webhook-v4-dcgm-exporter.json").read_text())
    found = [(a.node, a.firing, a.report.cls, a.report.action, a.report.subject)
             for a in parse_webhook(payload)]
    assert found == [
        ("gpu-017.cluster.example", True, H.GPU_LOST, A.RESTART_OS,  # action: restart_bm
         "UUID=GPU-0b5a3c4e-5b8a-7f2e-9d1c-3e4f5a6b7c8d"),
        ("gpu-017.cluster.example", False, H.GPU_MEMORY, A.NONE,  # restart_app: NVIDIA's
         "UUID=GPU-7d2e1f0a-9c8b-4a3e-8f7d-6c5b4a392817"),
        ("gpu-018.cluster.example", True, H.THERMAL, A.DRAIN,  # critical, "investigate"
         "UUID=GPU-3c9e8d7f-1a2b-4c5d-9e8f-0a1b2c3d4e5f")]


def test_alert_class_label_and_xid_label_win() -> None:
    alerts = parse_webhook({"version": "4", "alerts": [
        {"status": "firing", "labels": {"alertname": "Anything", "node": "n1",
                                        "class": "leak", "severity": "warning"}},
        {"status": "firing", "labels": {"alertname": "DCGM_FI_DEV_XID_ERRORS", "node": "n1",
                                        "xid": "74", "gpu": "2", "severity": "critical"}},
    ]})
    assert [(a.report.cls, a.report.action, a.report.subject) for a in alerts] == [
        (H.LEAK, A.NONE, ""), (H.NVLINK, A.RESET_GPU, "gpu=2")]


@pytest.mark.parametrize("payload", [
    [], {"version": "3", "alerts": []}, {"alerts": {}}, {"alerts": [1]},
    {"alerts": [{"status": "pending", "labels": {"node": "n"}}]},
    {"alerts": [{"labels": {"node": 1}}]},
])
def test_not_a_webhook_is_refused(payload: object) -> None:
    with pytest.raises(InvalidRequest):
        parse_webhook(payload)


def test_kube_sync_reads_conditions_allocatable_and_gpu_count() -> None:
    from provisioner.kube.model import Condition, NodeInfo
    from provisioner.kube.sync import health_reports

    info = NodeInfo(name="gpu-001", resource_version="1",
                    labels={"nvidia.com/gpu.count": "8"},
                    allocatable={"nvidia.com/gpu": "6", "cpu": "96"},
                    conditions=(Condition("Ready", "True", "KubeletReady"),
                                Condition("GpuXidError", "True", "XidCriticalError",
                                          "XID 79 on GPU 0000:3b:00.0"),))
    assert classes(health_reports(info, NOW, 60)) == [
        (H.GPU_LOST, A.RESTART_OS, "condition/GpuXidError"),
        (H.GPU_LOST, A.RESET_GPU, "nvidia.com/gpu")]


def test_source_times_travel_with_the_reports_but_are_not_their_identity() -> None:
    """Time to detect: an alert's ``startsAt`` (real notifications, nanoseconds and Go's
    zero time included) and a condition's last transition; two sightings of one fault at
    different times are the same report (a sync pass changes nothing)."""
    resolved = json.loads((FIXTURES / "alertmanager-webhook-v4-resolved-kube-state-metrics"
                           ".json").read_text())
    [alert] = parse_webhook(resolved)
    assert alert.report.seen_at == datetime(2022, 7, 29, 11, 13, 27, 300000, tzinfo=UTC)
    dcgm = json.loads((FIXTURES / "alertmanager-webhook-v4-dcgm-exporter.json").read_text())
    assert parse_webhook(dcgm)[0].report.seen_at == datetime(2026, 11, 27, 9, 12, 30,
                                                             tzinfo=UTC)
    for value, expected in (("2026-11-27T16:30:00.123456789Z",
                             datetime(2026, 11, 27, 16, 30, 0, 123456, tzinfo=UTC)),
                            ("0001-01-01T00:00:00Z", None), ("soon", None)):
        one = {"version": "4", "alerts": [{"labels": {"alertname": "GpuXid79", "node": "n1"},
                                           "startsAt": value}]}
        assert parse_webhook(one)[0].report.seen_at == expected
    down = [cond("Ready", "False", "KubeletNotReady", ago_s=300)]
    [report] = kube_reports(down, now=NOW, grace_s=60, allocatable_gpus=None, gpu_count=8)
    assert report.seen_at == NOW - timedelta(seconds=300)
    later = replace(report, seen_at=NOW)
    assert later == report and hash(later) == hash(report) and later.clipped() == report
    assert report.clipped().seen_at == report.seen_at
