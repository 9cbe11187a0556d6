"""KubeClient's boundary against the real apiserver: status codes become our errors, an
unreachable server is retryable after the client's retries, lists page."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from provisioner.errors import ConfigError
from provisioner.kube.model import KubeConflict, KubeForbidden, KubeNotFound, KubeUnavailable
from tests.integration.kube_support import connected, kube_settings
from tests.peers.kube import KubeCluster

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
