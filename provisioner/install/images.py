"""Image deploy driven by the node's agent: the daemon queues a ``deploy`` (or ``sanitise``)
job for the node, the agent in the ramdisk fetches it, streams the image to the
chosen disk,
checks its sha256, grows the last partition, writes the cloud-init seed built here (served
to it at ``/agent/v1/seed``) and reports back. Implements ``ImageWriter``.

Idempotent: a job names the deployment (the step's run id); after a daemon restart the step
queues the same job again, and an agent that already wrote that deployment reports success
without writing again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.config import DeploySettings, ImageSettings, InstallerSettings
from provisioner.domain import Node, Sanitised
from provisioner.errors import FatalError, RetryableError
from provisioner.install.seed import CALLBACK_PATH, SeedSpec, build_seed

log = logging.getLogger(__name__)
_FORMATS = {".raw": "raw", ".img": "raw", ".gz": "raw.gz", ".zst": "raw.zst",
            ".qcow2": "qcow2"}


@dataclass
class _Job:
    body: dict[str, Any]
    done: asyncio.Future[dict[str, Any]]
    seed: bytes = b""
    keep_failure: bool = False  # a failed job's report is the answer too (sanitise)


@dataclass(frozen=True, slots=True)
class SeedSource:
    """What the cloud-init seeds need: settings, the boot server's URL (the callback goes
    there) and the node's agent token (``AgentTokens.issue_token``)."""

    settings: DeploySettings
    base_url: str
    issue_token: Callable[[str], Awaitable[str]]


class AgentJobs:
    """Jobs waiting for nodes' agents (``AgentService.command`` hands them out): the
    lifecycle's ``AgentJobQueue``."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def pending(self, node_id: str) -> dict[str, Any] | None:
        job = self._jobs.get(node_id)
        return None if job is None or job.done.done() else job.body

    def seed(self, node_id: str, generation: str) -> bytes | None:
        """The cloud-init seed of the node's pending deploy job, if it names ``generation``."""
        job = self._jobs.get(node_id)
        if job is None or job.done.done() or job.body.get("generation") != generation:
            return None
        return job.seed or None

    def complete(self, node_id: str, generation: str, ok: bool, error: str,
                 report: dict[str, Any] | None = None) -> bool:
        job = self._jobs.get(node_id)
        if job is None or job.body.get("generation") != generation or job.done.done():
            return False
        if ok or job.keep_failure:
            job.done.set_result(dict(report or {}) | {"ok": ok, "error": error})
        else:
            job.done.set_exception(FatalError(f"agent: {error or 'failed without a reason'}"))
        return True

    async def run(self, node_id: str, body: dict[str, Any], *, seed: bytes = b"",
                  keep_failure: bool = False) -> dict[str, Any]:
        """Queue ``body`` for the node's agent and return its report; a failure raises
        FatalError unless ``keep_failure`` (then the report says ``ok``: False)."""
        job = _Job(body, asyncio.get_running_loop().create_future(), seed, keep_failure)
        self._jobs[node_id] = job
        try:
            return await job.done
        finally:
            if self._jobs.get(node_id) is job:
                del self._jobs[node_id]


def choose_disk(disks: list[Mapping[str, Any]],
                image: ImageSettings | InstallerSettings) -> str:
    """The device name the rule picks from the inspected disks; FatalError naming the rule."""
    rule, _, value = image.root_disk.partition(":")
    fit = [d for d in disks if d.get("size_bytes", 0) >= image.root_disk_min_gb * 1e9
           and not (image.root_disk_nonrotational and d.get("rotational", True))]
    chosen: list[Mapping[str, Any]]
    if rule in ("name", "serial", "wwn"):
        chosen = [d for d in fit if str(d.get(rule, "")) == value]
    elif rule in ("smallest", "largest"):
        chosen = sorted(fit, key=lambda d: (d.get("size_bytes", 0), str(d.get("name"))),
                        reverse=rule == "largest")[:1]
    else:
        raise FatalError(f"root_disk: unknown rule {image.root_disk!r}")
    if not chosen:
        names = ", ".join(f"{d.get('name')} ({d.get('size_bytes', 0) / 1e9:.0f} GB)"
                          for d in disks) or "none"
        raise FatalError(f"no disk fits root_disk {image.root_disk!r} (min "
                         f"{image.root_disk_min_gb:g} GB, nonrotational "
                         f"{image.root_disk_nonrotational}); inspected disks: {names}")
    return str(chosen[0]["name"])


class AgentImageWriter:
    """``overwrite_profiles``: the profiles whose disks may be overwritten with zeros when
    the drive offers no erase of its own (``[servicing.profiles.<p>] sanitise_overwrite``)."""

    def __init__(self, jobs: AgentJobs, images: Mapping[str, ImageSettings],
                 artefacts_url: str, *, seeds: SeedSource | None = None,
                 overwrite_profiles: frozenset[str] = frozenset()) -> None:
        self._jobs = jobs
        self._images = images
        self._artefacts_url = artefacts_url.rstrip("/")
        self._seeds = seeds
        self._overwrite = overwrite_profiles

    async def deploy_image(self, node: Node, generation: str) -> None:
        image = self._images.get(node.profile or "")
        if image is None:
            raise FatalError(f"profile {node.profile!r} names no image ([images.<profile>])")
        disks = node.facts.get("disks")
        if not isinstance(disks, list):
            raise RetryableError("no inspected disks for this node: inspect it first")
        disk = choose_disk(disks, image)
        url = image.url if "://" in image.url else f"{self._artefacts_url}/{image.url}"
        body = {"command": "deploy", "generation": generation, "url": url,
                "sha256": image.sha256, "format": image.format or _format_of(image.url),
                "disk": disk, "hostname": node.hostname or "",
                # no BMC to power-cycle it: the agent reboots into the disk itself
                "reboot": node.bmc is None}
        seed = await self._seed(node, generation)
        body["seed"] = bool(seed)
        log.info("node %s: deploying %s to %s (%s)", node.id, url, disk, generation)
        await self._jobs.run(node.id, body, seed=seed)

    async def _seed(self, node: Node, generation: str) -> bytes:
        if self._seeds is None:
            return b""
        spec = SeedSpec(
            instance_id=f"{node.id}-{generation.rpartition(':')[2]}",
            hostname=node.hostname or node.id, mac=node.macs[0] if node.macs else None,
            ssh_authorized_keys=tuple(self._seeds.settings.ssh_authorized_keys),
            callback_url=self._seeds.base_url.rstrip("/") + CALLBACK_PATH,
            token=await self._seeds.issue_token(node.id))
        return await asyncio.to_thread(build_seed, spec)  # a few ms of CPU

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        allow = (node.profile or "") in self._overwrite
        log.info("node %s: sanitising its disks (%s; overwrite %s)", node.id, generation,
                 "allowed" if allow else "not allowed")
        report = await self._jobs.run(node.id, {
            "command": "sanitise", "generation": generation, "skip": sorted(skip),
            "allow_overwrite": allow}, keep_failure=True)
        return Sanitised.from_report(report)

    async def build_arrays(self, node: Node, generation: str,
                           arrays: list[dict[str, Any]]) -> dict[str, Any]:
        log.info("node %s: building md arrays %s (%s)", node.id,
                 ", ".join(str(a.get("name")) for a in arrays), generation)
        return await self._jobs.run(node.id, {"command": "storage", "generation": generation,
                                              "arrays": arrays}, keep_failure=True)


def _format_of(url: str) -> str:
    for suffix, name in _FORMATS.items():
        if url.endswith(suffix):
            return name
    raise FatalError(f"cannot tell the format of {url!r}: set format in [images.<profile>]")
