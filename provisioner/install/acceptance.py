"""``AnsibleAcceptance``: runs ``playbooks/acceptance.yml`` over every node of a domain at once,
through the same SSH channel and runner as ``configuring`` (``AnsibleRunner``), and reads back
what each test printed (``<results>/<host>.json``) as ``ToolRun``s for the judge.

Deadlines: each test is killed on its node at ``test_deadline_s`` by the playbook's runner
script (with everything it started, and whatever carries the run's marker afterwards); the
whole playbook is bounded by runner's timeout and the install watchdog at the sum of the
tests' deadlines plus a margin, so even a node that stops answering cannot hold the stage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from provisioner.acceptance.domain import DOMAIN, ToolRun, scope_of
from provisioner.config import AcceptanceProfile, InstallSettings
from provisioner.domain import Node
from provisioner.errors import FatalError
from provisioner.install.ansible import AnsibleRunner, RunnerOptions, RunSpec
from provisioner.install.base import OnEvent
from provisioner.install.installer import AnsibleInstaller, node_address
from provisioner.install.workdir import safe_name

log = logging.getLogger(__name__)
PLAYBOOK: Final = "acceptance.yml"
_MARGIN_S: Final = 300.0  # copying the runner script, gathering, fetching
_IB_STEPS: Final = 3  # the ib_write_bw server, client, and the wait for the server


class AnsibleAcceptance:
    """The daemon's ``AcceptanceLauncher``."""

    def __init__(self, installer: AnsibleInstaller, settings: InstallSettings, *,
                 results_dir: Path, on_event: OnEvent | None = None) -> None:
        self._installer = installer
        self._settings = settings
        self._results_dir = results_dir
        self._on_event = on_event

    def budget_s(self, profile: AcceptanceProfile) -> float:
        """How long a whole run may take: each test's deadline, plus a margin."""
        steps = sum(_IB_STEPS * max(1, len(profile.ib_devices)) if test == "ib_write_bw"
                    else 1 for test in profile.tests)
        return steps * profile.test_deadline_s + _MARGIN_S

    async def launch(self, run_id: str, domain: str, nodes: Sequence[Node],
                     profile: AcceptanceProfile, class_gpus: int | None) -> list[ToolRun]:
        if not nodes:
            raise FatalError(f"fabric acceptance of {domain}: no nodes to run on")
        results = self._results_dir / safe_name(run_id)
        await asyncio.to_thread(results.mkdir, parents=True, exist_ok=True, mode=0o700)
        aliases = [node.hostname or node.id for node in nodes]
        addresses = [node_address(node, self._settings.address_fallback) for node in nodes]
        hosts: dict[str, object] = {}
        for node, alias in zip(nodes, aliases, strict=True):
            inventory: Any = self._installer.inventory(node)
            hosts[alias] = inventory["all"]["hosts"][alias]
        scope = scope_of(profile.nccl_scope, class_gpus)
        extravars: dict[str, object] = {
            "acceptance_run": safe_name(run_id), "acceptance_tests": list(profile.tests),
            "acceptance_deadline_s": profile.test_deadline_s,
            "acceptance_dcgm_level": profile.dcgm_level, "acceptance_nccl_scope": scope,
            "acceptance_gpus_per_node": profile.gpus_per_node,
            "acceptance_mpi_np": profile.gpus_per_node * len(nodes),
            "acceptance_mpi_hosts": ",".join(f"{a}:{profile.gpus_per_node}"
                                             for a in addresses),
            # every node's host engine at its default port (5555); the first is the head.
            # One request takes at most 72 hosts: an NVL72 domain has 18.
            "acceptance_mndiag_hosts": ";".join(addresses),
            "acceptance_ib_devices": list(profile.ib_devices),
            # node i's client reaches node i-1's server (a ring); one node: its own
            "acceptance_ib_peer": {alias: (addresses[i - 1] if len(nodes) > 1 else "127.0.0.1")
                                   for i, alias in enumerate(aliases)},
            "acceptance_results": str(results),
        }
        runner = self._runner(profile)
        spec = RunSpec(node_id=safe_name(domain), run_id=run_id, playbook=PLAYBOOK,
                       inventory={"all": {"hosts": hosts}}, extravars=extravars)
        try:
            result = await runner.run(spec)
            if not result.ok:
                log.warning("fabric acceptance %s of %s: playbook %s (rc %d): %s", run_id,
                            domain, result.status, result.rc, result.stdout_tail[-500:])
            runs = await asyncio.to_thread(read_results, results, aliases)
            if not runs and not result.ok:
                raise FatalError(f"playbook {PLAYBOOK} {result.status} (rc {result.rc}): "
                                 + (result.failures[0].summary() if result.failures
                                    else result.stdout_tail[-300:]))
            return runs
        finally:
            await asyncio.to_thread(shutil.rmtree, results, True)

    def _runner(self, profile: AcceptanceProfile) -> AnsibleRunner:
        base: RunnerOptions = self._installer.runner.options
        budget = self.budget_s(profile)
        options = replace(base, timeout_s=budget,
                          deadline_s=budget + self._settings.run_grace_s)
        return AnsibleRunner(options, self._installer.runner.pool, self._on_event)


def read_results(results: Path, aliases: Sequence[str]) -> list[ToolRun]:
    """Each host's ``<alias>.json`` as ``ToolRun``s; a host whose file never came back
    reports nothing (the judge fails what it expected there). ``nccl_domain`` and
    ``mndiag`` ran once, for the domain (on its first node)."""
    runs: list[ToolRun] = []
    for alias in aliases:
        try:
            data = json.loads((results / f"{alias}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for name, item in data.items():
            if not isinstance(item, dict):
                continue
            node, test = ((DOMAIN, "nccl") if name == "nccl_domain" else
                          (DOMAIN, name) if name == "mndiag" else (alias, name))
            if test.startswith("ib_write_bw_server-"):
                continue  # the client's report is the pair's figure
            probe = item.get("probe")
            probe = probe if isinstance(probe, dict) else {}
            runs.append(ToolRun(node=node, test=test, rc=int(item.get("rc", -1)),
                                stdout=str(item.get("stdout", "")),
                                stderr=str(item.get("stderr", "")),
                                timed_out=bool(item.get("timed_out")),
                                deadline_s=float(item.get("deadline_s", 0.0)),
                                available=item.get("available") is not False,
                                version=str(item.get("version", "")),
                                probe=str(probe.get("stdout", "")) + str(probe.get("stderr", ""))))
    return runs
