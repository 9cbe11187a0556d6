"""KubeClient's boundary against the real apiserver: status codes become our errors, an
unreachable server is retryable after the client's retries, lists page."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from provisioner.errors import ConfigError, RetryableError
from provisioner.kube.model import KubeConflict, KubeForbidden, KubeNotFound, KubeUnavailable
from provisioner.watchdog import CallDeadlineExceeded, PoolExhausted
from tests.integration.kube_support import connected, kube_settings, poll
from tests.peers.kube import KubeCluster
from tests.peers.tcp_proxy import tcp_proxy

pytestmark = pytest.mark.timeout(60)


def _token_kubeconfig(path: Path, server: str, ca: Path, token: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server,
                                               "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


async def test_status_codes_map_to_our_errors(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    async with connected(kube_settings(kube_cluster)) as kube:
        assert await kube.find_node("no-such-node") is None
        with pytest.raises(KubeNotFound):
            await kube.get_node("no-such-node")
        assert await kube.delete_node("no-such-node") is False
        await kube.create_secret("default", "dup", type_="Opaque", string_data={"a": "b"})
        with pytest.raises(KubeConflict):
            await kube.create_secret("default", "dup", type_="Opaque", string_data={"a": "b"})
        assert await kube.delete_secret("default", "dup") is True
        info = await kube.cluster_info()
        assert info.server == kube_cluster.server and info.ca_pem == kube_cluster.ca_pem
        assert kube.stats.failures == 0

    bad = _token_kubeconfig(tmp_path / "bad", kube_cluster.server, kube_cluster.pki.ca_crt,
                            "abcdef.0123456789abcdef")
    async with connected(kube_settings(kube_cluster, kubeconfig=bad)) as kube:
        with pytest.raises(KubeForbidden, match="401"):
            await kube.list_nodes()


async def test_unreachable_apiserver_is_retryable(kube_cluster: KubeCluster,
                                                  tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    dead = _token_kubeconfig(tmp_path / "dead", f"https://127.0.0.1:{port}",
                             kube_cluster.pki.ca_crt, "x")
    settings = kube_settings(kube_cluster, kubeconfig=dead, retries=2, retry_backoff_s=0.01)
    async with connected(settings) as kube:
        with pytest.raises(KubeUnavailable, match="after 3 tries"):
            await kube.get_node("n")
        assert (kube.stats.requests, kube.stats.retries, kube.stats.failures) == (3, 2, 1)


async def test_missing_kubeconfig_is_a_config_error(kube_cluster: KubeCluster,
                                                    tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kube.kubeconfig"):
        async with connected(kube_settings(kube_cluster, kubeconfig=tmp_path / "absent")):
            pass


async def test_an_apiserver_that_stops_answering_fails_calls_on_the_watchdog_deadline(
        kube_cluster: KubeCluster, tmp_path: Path) -> None:
    """The apiserver behind a proxy that black-holes every connection (TCP up, no byte
    either way), with urllib3's own timeouts far away: each call fails on the watchdog's
    deadline, retryably; with both "kube" threads held by hung calls the next call fails
    at once; once the server answers again the threads come back and calls work."""
    with tcp_proxy(int(kube_cluster.server.rsplit(":", 1)[1])) as proxy:
        kubeconfig = tmp_path / "proxied"
        kubeconfig.write_text(kube_cluster.kubeconfig.read_text().replace(
            kube_cluster.server, f"https://127.0.0.1:{proxy.port}"))
        settings = kube_settings(kube_cluster, kubeconfig=kubeconfig, max_concurrency=2,
                                 request_timeout_s=120.0, call_deadline_s=1.0, retries=0)
        async with connected(settings) as kube:
            assert await kube.find_node("no-such-node") is None
            proxy.stall()
            started = time.monotonic()
            calls = await asyncio.gather(kube.get_node("a"), kube.list_nodes(),
                                         return_exceptions=True)
            assert 1.0 <= time.monotonic() - started < 5.0  # loaded CI machines: slack
            for failed in calls:
                assert isinstance(failed, CallDeadlineExceeded), failed
                assert isinstance(failed, RetryableError)
                assert "within its 1 s deadline" in str(failed)
            assert "kube request for node a: " in str(calls[0])
            assert kube.hung_calls == 2
            started = time.monotonic()
            with pytest.raises(PoolExhausted, match="all 2 threads of the \"kube\" pool"):
                await kube.get_node("b")
            assert time.monotonic() - started < 1.0
            proxy.resume()
            await poll(lambda: True if kube.hung_calls == 0 else None, what="threads back")
            assert await kube.find_node("no-such-node") is None
