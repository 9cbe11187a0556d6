"""``AnsibleInstaller``: the ``configuring`` step (``site.yml``) and the ``kubeadm join`` hook
(``join.yml``), both run through ``AnsibleRunner``.

The node's address: ``node.facts["address"]`` when set (the deploy's expected callback sets
it: the address our DHCP server bound for the node, else the one its token is bound to);
its SSH host keys are pinned (``known_hosts.py``); otherwise, with ``install.address_fallback =
"hostname"`` (the default), the node's hostname, resolved by the site's DNS; otherwise the
step fails saying so.

Secrets reach the playbooks only as answers to ``vars_prompt`` (see ``ansible.py``): the join
token as ``kube_join_token``, the node's agent token as ``provisioner_agent_token``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import Executor
from pathlib import Path
from typing import Protocol

from provisioner.config import InstallSettings
from provisioner.domain import Node
from provisioner.errors import ConfigError, FatalError
from provisioner.install.ansible import (
    AnsibleRunner,
    RunnerOptions,
    RunSpec,
    find_ansible_playbook,
)
from provisioner.install.base import AgentEndpoint, OnEvent
from provisioner.install.events import raise_for
from provisioner.install.known_hosts import known_hosts_blocking
from provisioner.install.workdir import (
    FACTS_PLAYBOOK,
    control_path_dir_blocking,
    find_playbooks,
    one_host_inventory,
)

log = logging.getLogger(__name__)
PROBE_PLAYBOOK = "health-probe.yml"
_GROUP_UNSAFE = re.compile(r"\W+")


class JoinCredentials(Protocol):
    """What ``join.yml`` needs (``kube.join.JoinTicket`` fits). ``token`` is a secret."""

    @property
    def endpoint(self) -> str: ...

    @property
    def token(self) -> str: ...

    @property
    def ca_cert_hashes(self) -> tuple[str, ...]: ...


def node_address(node: Node, fallback: str) -> str:
    address = node.facts.get("address")
    if isinstance(address, str) and address.strip():
        return address.strip()
    if fallback == "hostname" and node.hostname:
        return node.hostname
    raise FatalError(f"node {node.id} has no address: neither facts.address nor a hostname "
                     "(install.address_fallback)")


def group_name(prefix: str, value: str) -> str:
    """An Ansible-safe group name (``profile_gpu_worker``)."""
    return f"{prefix}_{_GROUP_UNSAFE.sub('_', value).strip('_').lower() or 'none'}"


class AnsibleInstaller:
    """Configures deployed nodes and joins them to Kubernetes with the shipped playbooks."""

    def __init__(self, settings: InstallSettings, runner: AnsibleRunner, *,
                 agent: AgentEndpoint | None = None) -> None:
        self._settings = settings
        self._runner = runner
        self._agent = agent

    @classmethod
    def create(cls, settings: InstallSettings, *, state_dir: Path, pool: Executor,
               agent: AgentEndpoint | None = None,
               on_event: OnEvent | None = None) -> AnsibleInstaller:
        """Check what a run needs at startup (ConfigError naming the key), then build."""
        binary = find_ansible_playbook()
        playbooks = find_playbooks(settings.playbooks_dir)
        key = settings.ssh_private_key_file
        if key is not None and not key.is_file():
            raise ConfigError(f"install.ssh_private_key_file: {key} does not exist")
        options = RunnerOptions(state_dir=state_dir, playbooks=playbooks, binary=binary,
                                timeout_s=settings.run_timeout_s, forks=settings.forks,
                                keep_failed_runs=settings.keep_failed_runs,
                                deadline_s=settings.run_timeout_s + settings.run_grace_s,
                                pool_slots=settings.max_concurrency,
                                control_path_dir=control_path_dir_blocking(
                                    state_dir / "ansible"))
        log.info("ansible: %s, playbooks in %s", binary, playbooks)
        return cls(settings, AnsibleRunner(options, pool, on_event), agent=agent)

    @property
    def runner(self) -> AnsibleRunner:
        return self._runner

    def set_event_sink(self, on_event: OnEvent | None) -> None:
        self._runner.set_event_sink(on_event)

    async def configure(self, node: Node, generation: str) -> None:
        """``site.yml`` for the node's profile. Idempotent, so a resumed step reruns it."""
        agent_url, agent_token = "", ""
        if self._agent is not None:
            agent_url, agent_token = self._agent.url, await self._agent.issue_token(node.id)
        extravars = self.variables(node) | {"provisioner_agent_url": agent_url}
        spec = RunSpec(node_id=node.id, run_id=generation, playbook="site.yml",
                       inventory=await self.pinned_inventory(node), extravars=extravars,
                       secrets={"provisioner_agent_token": agent_token})
        raise_for(await self._runner.run(spec), f"configure {node.hostname or node.id}")
        if self._agent is not None and self._agent.issue_probe_token is not None \
                and (self._runner.options.playbooks / PROBE_PLAYBOOK).is_file():
            await self.install_health_probe(node, generation,
                                            await self._agent.issue_probe_token(node.id))

    async def install_health_probe(self, node: Node, generation: str, token: str) -> None:
        """``health-probe.yml``: the in-band health probe (a systemd timer) and its token,
        which reaches the node only over this SSH (``lifecycle.inband``)."""
        url = self._agent.url if self._agent is not None else ""
        period = self._agent.probe_period_s if self._agent is not None else 60.0
        spec = RunSpec(node_id=node.id, run_id=f"{generation}-probe", playbook=PROBE_PLAYBOOK,
                       inventory=await self.pinned_inventory(node),
                       extravars=self.variables(node) | {"provisioner_agent_url": url,
                                                         "health_probe_period_s": int(period)},
                       secrets={"provisioner_probe_token": token})
        raise_for(await self._runner.run(spec), f"health probe of {node.hostname or node.id}")

    async def collect_facts(self, node: Node, generation: str) -> None:
        """``facts.yml`` (the ``facts`` role alone): the node reports its facts again. A site's
        playbooks dir without it gets ``site.yml`` instead: idempotent, and it ends with the
        same role."""
        agent_url, agent_token = "", ""
        if self._agent is not None:
            agent_url, agent_token = self._agent.url, await self._agent.issue_token(node.id)
        extravars = self.variables(node) | {"provisioner_agent_url": agent_url}
        playbook = FACTS_PLAYBOOK if (self._runner.options.playbooks
                                      / FACTS_PLAYBOOK).is_file() else "site.yml"
        spec = RunSpec(node_id=node.id, run_id=f"{generation}-facts", playbook=playbook,
                       inventory=self.inventory(node), extravars=extravars,
                       secrets={"provisioner_agent_token": agent_token})
        raise_for(await self._runner.run(spec), f"facts of {node.hostname or node.id}")

    async def reset_gpus(self, node: Node) -> None:
        """The repair ladder's ``reset_gpu`` rung: ``gpu-reset.yml`` (``nvidia-smi -r`` per
        GPU, what holds the GPUs stopped around it)."""
        await self._remedy(node, "gpu-reset.yml", "GPU reset")

    async def restart_os(self, node: Node, timeout_s: float = 900.0) -> None:
        """The ``restart_os`` rung: ``reboot.yml`` (Ansible's reboot module: returns once
        the node answers again, within ``timeout_s``)."""
        await self._remedy(node, "reboot.yml", "OS restart", timeout_s)

    async def wait_os(self, node: Node, timeout_s: float = 900.0) -> None:
        """After a power cycle: ``wait-os.yml`` (``wait_for_connection``)."""
        await self._remedy(node, "wait-os.yml", "wait for the OS", timeout_s)

    async def _remedy(self, node: Node, playbook: str, what: str,
                      timeout_s: float = 900.0) -> None:
        spec = RunSpec(node_id=node.id, run_id=f"repair-{node.history_seq}-{playbook[:-4]}",
                       playbook=playbook, inventory=self.inventory(node),
                       extravars=self.variables(node) | {
                           "provisioner_os_up_timeout_s": int(timeout_s)})
        raise_for(await self._runner.run(spec), f"{what} of {node.hostname or node.id}")

    async def run_join(self, ticket: JoinCredentials, node: Node) -> None:
        """``kubeadm join`` through ``join.yml`` (the kube join hook, ``RunJoin``)."""
        if not node.hostname:
            raise FatalError(f"node {node.id} has no hostname: it cannot join Kubernetes")
        extravars = self.variables(node) | {
            "kube_join_endpoint": ticket.endpoint,
            "kube_join_ca_cert_hashes": list(ticket.ca_cert_hashes),
            "kube_node_name": node.hostname.lower(),
        }
        spec = RunSpec(node_id=node.id, run_id=f"join-{node.history_seq}", playbook="join.yml",
                       inventory=await self.pinned_inventory(node), extravars=extravars,
                       secrets={"kube_join_token": ticket.token})
        raise_for(await self._runner.run(spec), f"kubeadm join of {node.hostname}")

    async def pinned_inventory(self, node: Node) -> dict[str, object]:
        """``inventory`` with the node's pinned host keys (``known_hosts.py``)."""
        pinning = await asyncio.to_thread(known_hosts_blocking, node,
                                          self._runner.options.state_dir)
        return self.inventory(node, host_key_args=pinning)

    def inventory(self, node: Node, *, host_key_args: str = "") -> dict[str, object]:
        settings = self._settings
        hostvars: dict[str, object] = {
            "ansible_host": node_address(node, settings.address_fallback),
            "ansible_port": settings.ssh_port,
            "ansible_user": settings.ssh_user,
            "ansible_ssh_common_args": f"{host_key_args} {settings.ssh_common_args}".strip(),
            "ansible_python_interpreter": "auto_silent",
        }
        if settings.ssh_private_key_file is not None:
            hostvars["ansible_ssh_private_key_file"] = str(settings.ssh_private_key_file)
        groups = [group_name("profile", node.profile)] if node.profile else []
        return one_host_inventory(node.hostname or node.id, hostvars, groups)

    def variables(self, node: Node) -> dict[str, object]:
        """Non-secret extra vars: defaults, then ``extra_vars``, then the profile's vars;
        the node's identity last (never overridden)."""
        settings = self._settings
        values: dict[str, object] = {
            "kubernetes_version": settings.kubernetes_version,
            "provisioner_install_packages": settings.install_packages,
        }
        values |= settings.extra_vars
        values |= settings.profile_vars.get(node.profile or "", {})
        values |= {"provisioner_node_id": node.id, "provisioner_hostname": node.hostname or "",
                   "provisioner_profile": node.profile or "",
                   # what the machine reported: a string Ansible never templates
                   "provisioner_serial": unsafe(node.serial or "")}
        return values


def unsafe(text: str) -> dict[str, str]:
    """``text`` as Ansible's unsafe string in a JSON vars file (``-e @env/extravars``): used
    literally, never templated, so a reported ``{{ lookup('pipe', ...) }}`` stays text."""
    return {"__ansible_unsafe": text}
