"""The drivers that reach other systems, connected when configured: Kubernetes, Slurm (with
the hand-off between them), Ansible, the agents that write images. What a connection holds
is closed by the daemon's exit stack."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack

from provisioner.boot.stack import base_url
from provisioner.config import Settings
from provisioner.install.base import AgentEndpoint
from provisioner.install.images import AgentImageWriter, AgentJobs, SeedSource
from provisioner.install.installer import AnsibleInstaller
from provisioner.kube.client import KubeClient
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.kube.release import KubeOnlyHandoff
from provisioner.lifecycle.agents import AgentTokens
from provisioner.lifecycle.inband import issue_probe_token
from provisioner.lifecycle.ports import KubeJoiner, SlurmRegistrar
from provisioner.lifecycle.routing import Unavailable
from provisioner.slurm.client import make_slurm_client
from provisioner.slurm.handoff import SlurmHandoff
from provisioner.slurm.maintenance import SlurmFirstKube
from provisioner.slurm.model import SlurmClient
from provisioner.store.tokens import TokenRepo
from provisioner.topology_live.live import LiveTopology


async def connect_kube(settings: Settings, stack: AsyncExitStack) -> KubeClient | None:
    """The Kubernetes client, on its own pool; None without ``kube.kubeconfig``."""
    kube = settings.kube
    if kube.kubeconfig is None:
        return None
    pool = ThreadPoolExecutor(kube.max_concurrency, thread_name_prefix="kube")
    stack.callback(pool.shutdown, wait=False)
    client = await KubeClient.connect(kube, executor=pool)
    stack.push_async_callback(client.aclose)
    return client


async def connect_slurm(settings: Settings, stack: AsyncExitStack) -> SlurmClient | None:
    """The Slurm client (slurmrestd or scontrol); None unless ``slurm.enabled``."""
    if not settings.slurm.enabled:
        return None
    client = make_slurm_client(settings.slurm)
    stack.push_async_callback(client.aclose)
    return client


def kube_and_slurm(settings: Settings, joiner: KubeNodeJoiner | None,
                   kube_client: KubeClient | None, slurm_client: SlurmClient | None,
                   topology: LiveTopology) -> tuple[KubeJoiner, SlurmRegistrar]:
    """The ``kube`` and ``slurm`` drivers of real nodes. With Slurm, the hand-off
    releases the GPU operands (through the joiner) and maintenance drains in Slurm
    before Kubernetes evicts."""
    kube: KubeJoiner = joiner or Unavailable("Kubernetes join", "set kube.kubeconfig")
    if slurm_client is None:  # no Slurm: registering hands the node to Kubernetes only
        return kube, KubeOnlyHandoff(joiner)
    handoff = SlurmHandoff(
        slurm_client, settings.slurm, kube=kube_client,
        topology_spec=lambda node: topology.spec_for(node.hostname or ""),
        gpu_ready=joiner.release_operands if joiner is not None else None,
        nodesets=kube_client)
    return SlurmFirstKube(kube, handoff), handoff


def ansible_installer(settings: Settings, stack: AsyncExitStack,
                      agent_tokens: AgentTokens, tokens: TokenRepo) -> AnsibleInstaller:
    """The "install" pool (runs take tens of minutes) and the Ansible installer; its
    ``facts`` role posts to the boot server's agent API with a node's agent token."""
    install = settings.install
    pool = ThreadPoolExecutor(install.max_concurrency, thread_name_prefix="install")
    stack.callback(pool.shutdown, wait=False)
    agent = None
    if settings.http.listen is not None:
        # a controller token: the facts role posts from this host, not from the node
        agent = AgentEndpoint(base_url(settings), agent_tokens.issue_controller_token,
                              issue_probe_token=lambda node_id: issue_probe_token(
                                  tokens, node_id, settings.health.probe_token_ttl_s),
                              probe_period_s=settings.health.probe_period_s)
    return AnsibleInstaller.create(install, state_dir=settings.state_dir, pool=pool,
                                   agent=agent)


def image_writer(settings: Settings, jobs: AgentJobs,
                 agent_tokens: AgentTokens) -> AgentImageWriter | None:
    """Images are written by the nodes' agents, which need the boot HTTP server; the
    cloud-init seed's callback goes there too, with the node's agent token."""
    if settings.http.listen is None:
        return None
    url = base_url(settings)
    overwrite = frozenset(name for name, profile in settings.servicing.profiles.items()
                          if profile.sanitise_overwrite)
    return AgentImageWriter(jobs, settings.images, f"{url}/artefacts",
                            seeds=SeedSource(settings.deploy, url, agent_tokens.issue_token),
                            overwrite_profiles=overwrite)
