"""The only module that imports ``kubernetes``.

Every call runs on the bounded "kube" thread pool under a watchdog deadline
(``kube.call_deadline_s``, ``provisioner.watchdog``: a call that hangs beyond urllib3's own
socket timeouts fails ``CallDeadlineExceeded``, not retried here, and its thread stays
abandoned until it returns; with every thread so held, calls fail fast ``PoolExhausted``),
after a token from the client-side rate limiter; 429, 5xx and connection errors are
retried with back-off (honouring Retry-After);
``ApiException`` is mapped to our errors here. Responses are read raw and parsed into the
plain values of ``kube.model``: no ``kubernetes`` type leaves this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from provisioner.config import KubeSettings
from provisioner.errors import ConfigError, RetryableError
from provisioner.kube.model import (
    ClientStats,
    ClusterInfo,
    ConfigMapInfo,
    EvictionBlocked,
    KubeConflict,
    KubeForbidden,
    KubeNotFound,
    KubeRejected,
    KubeUnavailable,
    NodeInfo,
    NodeWatch,
    PodInfo,
)
from provisioner.kube.ratelimit import TokenBucket
from provisioner.kube.status import blocking_pdb, retry_after, status_message
from provisioner.kube.stream import lines, unblock
from provisioner.kube.wire import cluster_info, config_map, node, node_watch, pod
from provisioner.retry import Backoff, retry_async
from provisioner.watchdog import Watchdog

log = logging.getLogger(__name__)
T = TypeVar("T")
PatchKind = Literal["strategic", "merge", "json"]
_NODESET = ("slinky.slurm.net", "v1beta1", "nodesets")  # group, version, plural
_CONTENT_TYPES: dict[str, str] = {
    "strategic": "application/strategic-merge-patch+json",
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
}
_MAX_BACKOFF_S = 30.0
_PAGE = 500


class KubeClient:
    """Typed, rate-limited, retrying async facade over one cluster's API."""

    def __init__(self, api: Any, settings: KubeSettings, *,
                 executor: ThreadPoolExecutor | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._api = api
        self._core = k8s.CoreV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._settings = settings
        self._own_pool = executor is None
        self._pool = executor or ThreadPoolExecutor(settings.max_concurrency, "kube")
        self._watchdog = Watchdog(self._pool, name="kube", slots=settings.max_concurrency)
        self._bucket = TokenBucket(settings.qps, settings.burst)
        self._sleep = sleep
        self.stats = ClientStats()

    @classmethod
    async def connect(cls, settings: KubeSettings, *,
                      executor: ThreadPoolExecutor | None = None) -> KubeClient:
        """Build a client from ``settings.kubeconfig`` (read on the pool, not the loop)."""
        if settings.kubeconfig is None:
            raise ConfigError("kube.kubeconfig is not set")
        pool = executor or ThreadPoolExecutor(settings.max_concurrency, "kube")
        watchdog = Watchdog(pool, name="kube", slots=settings.max_concurrency)
        try:  # an exec credential plugin in the kubeconfig runs here: it may hang too
            api = await watchdog.call(lambda: _api_client_blocking(settings),
                                      what=f"kube: loading {settings.kubeconfig}",
                                      deadline_s=settings.call_deadline_s)
        except BaseException:
            if executor is None:
                pool.shutdown(wait=False)
            raise
        client = cls(api, settings, executor=pool)
        client._own_pool = executor is None
        client._watchdog = watchdog
        return client

    @property
    def hung_calls(self) -> int:
        """Threads of the "kube" pool held by calls past their deadline."""
        return self._watchdog.hung

    async def aclose(self) -> None:
        try:
            await self._watchdog.call(self._api.close, what="kube: closing the client",
                                      deadline_s=self._settings.call_deadline_s)
        except RetryableError as exc:  # shutting down: a hung close must not stop that
            log.warning("%s", exc)
        if self._own_pool:
            self._pool.shutdown(wait=False)

    # Nodes ------------------------------------------------------------------------------

    async def get_node(self, name: str) -> NodeInfo:
        return node(await self._json(lambda **kw: self._core.read_node(name, **kw),
                                      what=f"node {name}"))

    async def find_node(self, name: str) -> NodeInfo | None:
        try:
            return await self.get_node(name)
        except KubeNotFound:
            return None

    async def list_nodes(self, label_selector: str | None = None) -> list[NodeInfo]:
        return (await self.list_nodes_at(label_selector))[0]

    async def list_nodes_at(self, label_selector: str | None = None
                            ) -> tuple[list[NodeInfo], str]:
        """The Nodes and the resource version of the list (where a watch goes on from)."""
        items, version = await self._list(
            lambda **kw: self._core.list_node(label_selector=label_selector, **kw), "nodes")
        return [node(item) for item in items], version

    async def watch_nodes(self, label_selector: str | None, resource_version: str, *,
                          timeout_s: int) -> NodeWatch:
        """The changes to the Nodes after ``resource_version``, watched for ``timeout_s``
        seconds (the apiserver ends the watch); ``NodeWatch.expired`` when that version is
        too old to watch from (410 Gone: list again). Not retried: the caller lists again."""
        what = "watch of nodes"
        held: list[Any] = []  # the response while its thread reads it
        lock = threading.Lock()

        def blocking() -> NodeWatch:
            with _mapped(what):
                raw = self._core.list_node(
                    label_selector=label_selector, watch=True, allow_watch_bookmarks=True,
                    resource_version=resource_version, timeout_seconds=timeout_s,
                    _preload_content=False,
                    _request_timeout=timeout_s + self._settings.request_timeout_s)
                with lock:
                    held.append(raw)
                try:
                    return node_watch(lines(raw), resource_version)
                finally:
                    with lock:  # from here its connection may serve another request
                        held.clear()
                    raw.release_conn()

        await self._bucket.acquire()
        self.stats.requests += 1
        try:
            return await self._watchdog.call(
                blocking, what=f"kube request for {what}",
                deadline_s=timeout_s + self._settings.call_deadline_s)
        except _Transient as exc:
            self.stats.failures += 1
            raise KubeUnavailable(f"{what}: {exc.detail}") from None
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.stats.failures += 1
            with lock:  # cancelled (the daemon stops) or past its deadline: cut the read
                for raw in held:
                    unblock(raw)
            raise

    async def patch_node(self, name: str, body: Any, *, kind: PatchKind = "strategic",
                         status: bool = False) -> NodeInfo:
        method = self._core.patch_node_status if status else self._core.patch_node
        return node(await self._json(
            lambda **kw: method(name, body, _content_type=_CONTENT_TYPES[kind], **kw),
            what=f"node {name}"))

    async def delete_node(self, name: str) -> bool:
        """Delete the Node; False if it was already gone."""
        try:
            await self._json(lambda **kw: self._core.delete_node(name, **kw),
                             what=f"node {name}")
        except KubeNotFound:
            return False
        return True

    # Slinky NodeSets ----------------------------------------------------------------------

    async def nodeset_extra_conf(self, namespace: str, name: str) -> str | None:
        """``spec.extraConf`` of a Slinky NodeSet (``slurmd --conf``); None when there is no
        such NodeSet, ``""`` when it has none."""
        try:
            doc = await self._json(lambda **kw: self._custom.get_namespaced_custom_object(
                *_NODESET[:2], namespace, _NODESET[2], name, **kw),
                what=f"NodeSet {namespace}/{name}")
        except KubeNotFound:
            return None
        spec = doc.get("spec") or {}
        return str(spec.get("extraConf") or "")

    async def set_nodeset_extra_conf(self, namespace: str, name: str, conf: str) -> None:
        await self._json(lambda **kw: self._custom.patch_namespaced_custom_object(
            *_NODESET[:2], namespace, _NODESET[2], name, {"spec": {"extraConf": conf}},
            _content_type=_CONTENT_TYPES["merge"], **kw), what=f"NodeSet {namespace}/{name}")

    # Pods -------------------------------------------------------------------------------

    async def list_pods(self, node_name: str) -> list[PodInfo]:
        selector = f"spec.nodeName={node_name}"
        items, _ = await self._list(lambda **kw: self._core.list_pod_for_all_namespaces(
            field_selector=selector, **kw), f"pods on {node_name}")
        return [pod(item) for item in items]

    async def evict_pod(self, namespace: str, name: str) -> bool:
        """Ask the Eviction API to evict a pod; False if it was already gone.

        A 429 (a PodDisruptionBudget allows no disruption) raises EvictionBlocked at once,
        without the client's retries: the drain loop owns that back-off and its deadline.
        """
        body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace))
        what = f"pod {namespace}/{name}"
        try:
            await self._json(lambda **kw: self._core.create_namespaced_pod_eviction(
                name, namespace, body, **kw), what=what, retry_429=False)
        except KubeNotFound:
            return False
        except _Throttled as exc:
            raise EvictionBlocked(what, exc.pdb, exc.detail) from None
        return True

    # Secrets and config maps --------------------------------------------------------------

    async def create_secret(self, namespace: str, name: str, *, type_: str,
                            string_data: Mapping[str, str],
                            labels: Mapping[str, str] | None = None) -> None:
        body = k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=dict(labels or {})),
            type=type_, string_data=dict(string_data))
        await self._json(lambda **kw: self._core.create_namespaced_secret(namespace, body, **kw),
                         what=f"secret {namespace}/{name}")

    async def delete_secret(self, namespace: str, name: str) -> bool:
        """Delete a Secret; False if it was already gone."""
        try:
            await self._json(lambda **kw: self._core.delete_namespaced_secret(
                name, namespace, **kw), what=f"secret {namespace}/{name}")
        except KubeNotFound:
            return False
        return True

    async def delete_secrets(self, namespace: str, label_selector: str) -> list[str]:
        """Delete the Secrets matching ``label_selector``; return their names."""
        items, _ = await self._list(lambda **kw: self._core.list_namespaced_secret(
            namespace, label_selector=label_selector, **kw), f"secrets in {namespace}")
        names = [item["metadata"]["name"] for item in items]
        for name in names:
            await self.delete_secret(namespace, name)
        return names

    async def get_config_map(self, namespace: str, name: str) -> ConfigMapInfo | None:
        """The ConfigMap, or None when there is none."""
        try:
            data = await self._json(lambda **kw: self._core.read_namespaced_config_map(
                name, namespace, **kw), what=f"configmap {namespace}/{name}")
        except KubeNotFound:
            return None
        return config_map(data)

    async def put_config_map(self, namespace: str, name: str, data: Mapping[str, str], *,
                             annotations: Mapping[str, str] | None = None,
                             resource_version: str | None = None) -> ConfigMapInfo:
        """Create the ConfigMap (``resource_version`` None) or replace the one at that
        version (KubeConflict when someone changed it since it was read)."""
        body = k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace,
                                      annotations=dict(annotations or {}),
                                      resource_version=resource_version),
            data=dict(data))
        what = f"configmap {namespace}/{name}"
        if resource_version is None:
            made = await self._json(lambda **kw: self._core.create_namespaced_config_map(
                namespace, body, **kw), what=what)
        else:
            made = await self._json(lambda **kw: self._core.replace_namespaced_config_map(
                name, namespace, body, **kw), what=what)
        return config_map(made)

    async def cluster_info(self) -> ClusterInfo:
        """The API endpoint and CA from ``kube-public/cluster-info`` (kubeadm publishes it)."""
        data = await self._json(lambda **kw: self._core.read_namespaced_config_map(
            "cluster-info", "kube-public", **kw), what="configmap kube-public/cluster-info")
        return cluster_info(data)

    # Plumbing -----------------------------------------------------------------------------

    async def _list(self, call: Callable[..., Any],
                    what: str) -> tuple[list[dict[str, Any]], str]:
        """Every item, paged, and the list's resource version (that of its first page: the
        pages of one list are one snapshot)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        version = ""
        while True:
            page = await self._json(
                lambda token=token, **kw: call(limit=_PAGE, _continue=token, **kw), what=what)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                return items, version

    async def _json(self, call: Callable[..., Any], *, what: str,
                    retry_429: bool = True) -> dict[str, Any]:
        """Run ``call`` on the pool under the rate limit, retrying; return the parsed body."""
        timeout = self._settings.request_timeout_s

        def blocking() -> dict[str, Any]:
            with _mapped(what):
                raw = call(_preload_content=False, _request_timeout=timeout)
                body = raw.data
            parsed: dict[str, Any] = json.loads(body) if body else {}
            return parsed

        tries = 0

        async def attempt() -> dict[str, Any]:
            nonlocal tries
            tries += 1
            if await self._bucket.acquire() > 0.001:
                self.stats.throttled += 1
            self.stats.requests += 1
            try:
                return await self._watchdog.call(blocking, what=f"kube request for {what}",
                                                 deadline_s=self._settings.call_deadline_s)
            except KubeConflict:
                self.stats.conflicts += 1
                raise
            except (_Transient, KubeNotFound):
                raise
            except Exception:  # CallDeadlineExceeded and PoolExhausted too: never retried here
                self.stats.failures += 1
                raise

        def pdb_refused(exc: BaseException) -> bool:
            """A PodDisruptionBudget said no: the caller's back-off decides."""
            return isinstance(exc, _Throttled) and bool(exc.pdb) and not retry_429

        def noted(exc: BaseException, retry: int, pause: float) -> None:
            self.stats.retries += 1
            log.warning("kube: %s: %s; retry %d in %.1f s", what,
                        exc.detail if isinstance(exc, _Transient) else exc, retry, pause)

        try:
            return await retry_async(
                attempt, backoff=Backoff(self._settings.retry_backoff_s, _MAX_BACKOFF_S),
                retryable=lambda exc: isinstance(exc, _Transient) and not pdb_refused(exc),
                tries=self._settings.retries + 1, sleep=self._sleep, on_retry=noted,
                hint=lambda exc: exc.retry_after_s if isinstance(exc, _Transient) else None)
        except _Transient as exc:
            if pdb_refused(exc):
                raise
            self.stats.failures += 1
            raise KubeUnavailable(f"{what}: {exc.detail} (after {tries} tries)") from None


class _Transient(Exception):
    def __init__(self, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s


class _Throttled(_Transient):
    def __init__(self, detail: str, retry_after_s: float | None, pdb: str) -> None:
        super().__init__(detail, retry_after_s)
        self.pdb = pdb


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Boundary translation: kubernetes/urllib3 exceptions → ours (or internal transients)."""
    try:
        yield
    except ApiException as exc:
        raise _map_api_exception(exc, what) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise _Transient(f"connection failed: {type(exc).__name__}") from exc
    except OSError as exc:
        raise _Transient(f"connection failed: {exc.strerror or exc}") from exc


def _map_api_exception(exc: ApiException, what: str) -> Exception:
    status = int(exc.status or 0)
    message = status_message(exc) or str(exc.reason or "")
    if status == 0:
        if "CERTIFICATE_VERIFY_FAILED" in message:
            return KubeForbidden(f"{what}: TLS verification of the apiserver failed: {message}")
        return _Transient(f"connection failed: {message}")
    if status == 404:
        return KubeNotFound("Kubernetes object", what)
    if status == 409:
        return KubeConflict(f"{what}: {message}")
    if status == 429:
        return _Throttled(f"429 {message}", retry_after(exc, _MAX_BACKOFF_S), blocking_pdb(exc))
    if status >= 500:
        return _Transient(f"{status} {message}", retry_after(exc, _MAX_BACKOFF_S))
    if status in (401, 403):
        return KubeForbidden(f"{what}: {status} {exc.reason}: {message}")
    return KubeRejected(f"{what}: {status} {message}")


def _api_client_blocking(settings: KubeSettings) -> Any:
    configuration = k8s.Configuration()
    try:
        k8s_config.load_kube_config(config_file=str(settings.kubeconfig),
                                    context=settings.context,
                                    client_configuration=configuration, persist_config=False)
    except (k8s_config.ConfigException, OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"kube.kubeconfig {settings.kubeconfig}: {exc}") from None
    configuration.connection_pool_maxsize = settings.max_concurrency
    configuration.retries = False  # our loop retries, with back-off and the rate limit
    return k8s.ApiClient(configuration)
