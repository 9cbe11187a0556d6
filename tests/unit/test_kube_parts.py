"""Pure and fake-clock parts of provisioner.kube: rate limiter, waits, sync rule, tokens, the
boundary mapping of ApiException."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from provisioner.config import KubeProfile
from provisioner.errors import FatalError, RetryableError
from provisioner.kube.client import _map_api_exception, _Throttled, _Transient
from provisioner.kube.drain import evictable
from provisioner.kube.join import JoinTicket, ca_cert_hashes, new_token, token_secret
from provisioner.kube.model import (
    Condition,
    KubeConflict,
    KubeForbidden,
    KubeNotFound,
    KubeRejected,
    KubeTimeout,
    NodeInfo,
    PodInfo,
)
from provisioner.kube.ratelimit import TokenBucket
from provisioner.kube.sync import maintenance_reason
from provisioner.kube.wait import NodeWaiter, gpu_stack_ready, ready
from tests.peers.kube_pki import make_pki
from tests.unit.test_kube_labels import node


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.t += s


async def test_token_bucket_allows_burst_then_qps() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, 5, now=clock.now, sleep=clock.sleep)
    for _ in range(5):
        assert await bucket.acquire() == 0.0
    for _ in range(10):
        await bucket.acquire()
    assert clock.t == pytest.approx(1.0)  # 10 more at 10/s


def test_ready_and_gpu_checks_name_what_is_missing() -> None:
    not_ready = NodeInfo("n", "1", conditions=(Condition("Ready", "False", "KubeletNotReady",
                                                         "PLEG"),))
    assert ready(None) == "no Node object"
    assert ready(not_ready) == "condition Ready=False (KubeletNotReady: PLEG)"
    up = NodeInfo("n", "1", conditions=(Condition("Ready", "True"),),
                  allocatable={"nvidia.com/gpu": "0"}, labels={"nvidia.com/gpu.count": "8"})
    check = gpu_stack_ready(KubeProfile(nvlink_multinode=True))
    assert check(up) == ('status.allocatable["nvidia.com/gpu"] > 0, '
                         "label nvidia.com/gpu.clique")
    done = NodeInfo("n", "1", conditions=up.conditions, allocatable={"nvidia.com/gpu": "4"},
                    labels={"nvidia.com/gpu.count": "4", "nvidia.com/gpu.clique": "u.1"})
    assert check(done) is None


async def test_waiter_times_out_naming_the_condition() -> None:
    clock = Clock()

    class Reader:
        async def find_node(self, name: str) -> NodeInfo | None:
            return NodeInfo(name, "1", conditions=(Condition("Ready", "Unknown"),))

    waiter = NodeWaiter(Reader(), poll_interval_s=2, now=clock.now, sleep=clock.sleep)
    with pytest.raises(KubeTimeout, match=r"node n: not Ready after 10 s: missing condition "
                                          r"Ready=Unknown"):
        await waiter.until("n", ready, timeout_s=10, what="Ready")
    assert clock.t == pytest.approx(10)


def test_maintenance_reason() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)

    def info(**kw: object) -> NodeInfo:
        return NodeInfo("n", "1", **kw)  # type: ignore[arg-type]
    assert maintenance_reason(info(unschedulable=True), now, 300) == "cordoned in Kubernetes"
    ours = info(unschedulable=True, annotations={"provisioner.io/cordon-reason": "retire"})
    assert maintenance_reason(ours, now, 300) is None
    down = Condition("Ready", "Unknown", "NodeStatusUnknown",
                     last_transition=now - timedelta(seconds=301))
    assert maintenance_reason(info(conditions=(down,)), now, 300) == (
        "Ready=Unknown for 301 s, NodeStatusUnknown")
    assert maintenance_reason(info(conditions=(down,)), now, 400) is None


def test_evictable_skips_daemonset_and_mirror_pods() -> None:
    assert evictable(PodInfo("ns", "p", "n", owner_kinds=("ReplicaSet",)))
    assert not evictable(PodInfo("ns", "p", "n", owner_kinds=("DaemonSet",)))
    assert not evictable(PodInfo("ns", "p", "n", mirror=True))


def test_token_format_and_secret_fields() -> None:
    token = new_token()
    assert re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", token)
    ticket = JoinTicket(server="https://10.0.0.1:6443", token=token, ca_cert_hashes=("sha256:x",))
    assert token not in repr(ticket) and ticket.endpoint == "10.0.0.1:6443"
    data = token_secret(token, node(), datetime(2025, 1, 1, 0, 30, tzinfo=UTC))
    assert data["token-id"] + "." + data["token-secret"] == token
    assert data["expiration"] == "2025-01-01T00:30:00Z"
    assert data["auth-extra-groups"] == "system:bootstrappers:kubeadm:default-node-token"
    assert data["usage-bootstrap-authentication"] == data["usage-bootstrap-signing"] == "true"
    assert "gpu-1" in data["description"]


def test_ca_pin_matches_kubeadms_openssl_recipe(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    pki = make_pki(tmp_path, service_ip="10.96.0.1")
    # kubeadm docs: openssl x509 -pubkey | openssl pkey -pubin -outform der | sha256sum
    pub = subprocess.run(["openssl", "x509", "-pubkey", "-noout", "-in", str(pki.ca_crt)],
                         capture_output=True, check=True).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pub,
                         capture_output=True, check=True).stdout
    assert ca_cert_hashes(pki.ca_pem) == ("sha256:" + hashlib.sha256(der).hexdigest(),)


def _exc(status: int, body: Mapping[str, object] | None = None,
         headers: dict[str, str] | None = None) -> ApiException:
    exc = ApiException(status=status, reason="r")
    exc.body = json.dumps(body or {"message": f"m{status}"})
    exc.headers = headers or {}
    return exc


@pytest.mark.parametrize(("status", "kind"), [
    (404, KubeNotFound), (409, KubeConflict), (401, KubeForbidden), (403, KubeForbidden),
    (422, KubeRejected), (500, _Transient), (503, _Transient), (429, _Throttled),
], ids=str)
def test_api_exceptions_map_to_our_errors(status: int, kind: type[Exception]) -> None:
    assert isinstance(_map_api_exception(_exc(status), "node x"), kind)
    assert issubclass(KubeForbidden, FatalError) and issubclass(KubeTimeout, RetryableError)


def test_429_names_the_pdb_and_honours_retry_after() -> None:
    body = {"message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget", "message":
                                    "The disruption budget web-pdb needs 2 healthy pods and "
                                    "has 2 currently"}]}}
    mapped = _map_api_exception(_exc(429, body, {"Retry-After": "3"}), "pod a/b")
    assert isinstance(mapped, _Throttled)
    assert mapped.pdb == "web-pdb" and mapped.retry_after_s == 3.0
    flow_control = _map_api_exception(_exc(429, {"message": "Too many requests"}), "pod a/b")
    assert isinstance(flow_control, _Throttled) and flow_control.pdb == ""  # retried as usual
