"""A real Kubernetes control plane started by the test (PEERS.md §10): etcd, kube-apiserver and
the kwok controller standing in for kubelets, on loopback ports, stopped by PID.

    if (reason := kube_unavailable_reason()) is not None: pytest.skip(reason)
    with running_kube() as cluster:       # cluster.kubeconfig: admin (system:masters)
        api = cluster.api_client()        # kubernetes.client.ApiClient for test set-up

Binaries come from ``tests/peers/kube_build.sh`` (scripts/setup.sh builds them once). What
kubeadm would add on a real cluster is created here too: ``kube-public/cluster-info`` and the
RBAC for bootstrap tokens. There is no controller-manager or scheduler: tests bind pods with
``spec.nodeName`` and play the disruption controller by writing PDB status themselves.
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tests.peers.kube_objects import install_kubeadm_objects
from tests.peers.kube_pki import Pki, make_pki
from tests.peers.ports import free_tcp_port, stop_process

BUILD_SCRIPT: Final = Path(__file__).with_name("kube_build.sh")
READY_TIMEOUT_S: Final = 90.0
STOP_TIMEOUT_S: Final = 10.0
SERVICE_CIDR: Final = "10.96.0.0/16"
SERVICE_IP: Final = "10.96.0.1"  # first address: the `kubernetes` Service
KWOK_ANNOTATION: Final = {"kwok.x-k8s.io/node": "fake"}
KWOK_TAINT: Final = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


@dataclass(frozen=True, slots=True)
class KubeCluster:
    server: str  # https://127.0.0.1:<port>
    kubeconfig: Path  # admin, client certificate in group system:masters
    pki: Pki
    workdir: Path

    @property
    def ca_pem(self) -> bytes:
        return self.pki.ca_pem

    def api_client(self, token: str | None = None) -> Any:
        """A kubernetes ApiClient: admin by default, or authenticated by a bearer ``token``."""
        from kubernetes import client, config

        if token is None:
            return config.new_client_from_config(str(self.kubeconfig), persist_config=False)
        cfg = client.Configuration()
        cfg.host = self.server
        cfg.ssl_ca_cert = str(self.pki.ca_crt)
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return client.ApiClient(cfg)


def bin_dir() -> Path | None:
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--check"], capture_output=True,
                          text=True, check=False, timeout=30)
    lines = done.stdout.strip().splitlines()
    return Path(lines[-1]) if done.returncode == 0 and lines else None


def kube_unavailable_reason() -> str | None:
    """Why running_kube() cannot work here, or None if it can."""
    if bin_dir() is None:
        return f"kube-apiserver/etcd/kwok not built: run bash {BUILD_SCRIPT} (scripts/setup.sh)"
    return None


@contextmanager
def running_kube(*, kwok: bool = True) -> Iterator[KubeCluster]:
    """etcd + kube-apiserver (+ kwok) on free loopback ports; all gone after the block."""
    bins = bin_dir()
    if bins is None:
        raise RuntimeError(kube_unavailable_reason())
    workdir = Path(tempfile.mkdtemp(prefix="provisioner-kube-", dir="/tmp"))
    try:
        with ExitStack() as procs:
            pki = make_pki(workdir / "pki", service_ip=SERVICE_IP)
            etcd_url = _start_etcd(procs, bins, workdir)
            port = free_tcp_port()
            server = f"https://127.0.0.1:{port}"
            _start_apiserver(procs, bins, workdir, pki, etcd_url, port)
            kubeconfig = workdir / "admin.kubeconfig"
            kubeconfig.write_text(admin_kubeconfig(server, pki))
            cluster = KubeCluster(server, kubeconfig, pki, workdir)
            install_kubeadm_objects(cluster.api_client(), server, pki.ca_pem)
            if kwok:
                _start_kwok(procs, bins, workdir, kubeconfig)
            yield cluster
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def admin_kubeconfig(server: str, pki: Pki) -> str:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return json.dumps({  # JSON is YAML: no PyYAML needed to write it
        "apiVersion": "v1", "kind": "Config", "current-context": "admin",
        "clusters": [{"name": "test", "cluster": {
            "server": server, "certificate-authority-data": b64(pki.ca_crt)}}],
        "users": [{"name": "admin", "user": {
            "client-certificate-data": b64(pki.admin_crt),
            "client-key-data": b64(pki.admin_key)}}],
        "contexts": [{"name": "admin", "context": {"cluster": "test", "user": "admin"}}],
    }, indent=1)


def _start_etcd(procs: ExitStack, bins: Path, workdir: Path) -> str:
    client_port, peer_port = free_tcp_port(), free_tcp_port()
    url, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    cmd = [str(bins / "etcd"), "--name=default", f"--data-dir={workdir / 'etcd'}",
           f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
           f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
           f"--initial-cluster=default={peer}", "--unsafe-no-fsync=true",
           "--log-level=warn", "--quota-backend-bytes=2147483648"]  # fmt: skip
    proc = _spawn(procs, cmd, workdir / "etcd.log")
    _wait(proc, workdir / "etcd.log", "etcd", lambda: _http_ok(f"{url}/health", b'"true"'))
    return url


def _start_apiserver(procs: ExitStack, bins: Path, workdir: Path, pki: Pki, etcd_url: str,
                     port: int) -> None:
    cmd = [str(bins / "kube-apiserver"),
           f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
           "--advertise-address=127.0.0.1", f"--secure-port={port}",
           f"--cert-dir={workdir / 'certs'}",
           f"--tls-cert-file={pki.apiserver_crt}", f"--tls-private-key-file={pki.apiserver_key}",
           f"--client-ca-file={pki.ca_crt}",
           f"--service-account-key-file={pki.sa_pub}",
           f"--service-account-signing-key-file={pki.sa_key}",
           "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
           f"--service-cluster-ip-range={SERVICE_CIDR}",
           "--authorization-mode=Node,RBAC", "--enable-bootstrap-token-auth=true",
           # No controller-manager creates service accounts, and no node-lifecycle
           # controller removes the not-ready taint TaintNodesByCondition would add.
           "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
           "--allow-privileged=true", "--profiling=false", "--v=0",
           "--endpoint-reconciler-type=none",
           ]  # fmt: skip
    proc = _spawn(procs, cmd, workdir / "kube-apiserver.log")
    ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
    ctx.load_cert_chain(str(pki.admin_crt), str(pki.admin_key))
    url = f"https://127.0.0.1:{port}/readyz"
    _wait(proc, workdir / "kube-apiserver.log", "kube-apiserver",
          lambda: _http_ok(url, b"ok", ctx))


def _start_kwok(procs: ExitStack, bins: Path, workdir: Path, kubeconfig: Path) -> None:
    stages = sorted((bins.parent / "stages").glob("*.yaml"))
    port = free_tcp_port()
    cmd = [str(bins / "kwok"), f"--kubeconfig={kubeconfig}",
           "--manage-all-nodes=false",
           "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
           "--node-lease-duration-seconds=40", "--cidr=10.244.0.0/16", "--node-ip=10.1.0.1",
           f"--server-address=127.0.0.1:{port}",
           *(f"--config={s}" for s in stages)]  # fmt: skip
    proc = _spawn(procs, cmd, workdir / "kwok.log")
    _wait(proc, workdir / "kwok.log", "kwok",
          lambda: _http_ok(f"http://127.0.0.1:{port}/healthz", b"ok"))


def _spawn(procs: ExitStack, cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file,
                                stderr=subprocess.STDOUT, cwd=log_path.parent)
    procs.callback(_stop, proc)
    return proc


def _wait(proc: subprocess.Popen[bytes], log_path: Path, name: str, probe: Any) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with rc {proc.returncode}:\n{_tail(log_path)}")
        if probe():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not ready after {READY_TIMEOUT_S} s:\n{_tail(log_path)}")
        time.sleep(0.1)


def _http_ok(url: str, needle: bytes, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # noqa: S310
            return resp.status == 200 and needle in resp.read()
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    stop_process(proc, STOP_TIMEOUT_S)



def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
