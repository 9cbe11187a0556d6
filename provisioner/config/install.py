"""``[install]``: the Ansible run that configures a deployed node and joins it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, JsonValue

from provisioner.config.section import Section


class InstallSettings(Section):
    """Ansible configuration of deployed nodes (``configuring``) and ``kubeadm join``."""

    playbooks_dir: Path | None = Field(
        None, description="Playbooks and roles (site.yml, join.yml); default the ones shipped "
        "with provisioner")
    ssh_user: str = Field("root", description="SSH user Ansible logs in as on a node")
    ssh_private_key_file: Path | None = Field(
        None, description="SSH private key for the nodes (referenced, never copied); unset: "
        "ssh's own defaults and agent")
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port of the nodes")
    ssh_common_args: str = Field(
        "-o ConnectTimeout=10",
        description="Extra ssh options (ansible_ssh_common_args), after the host key pinning "
        "the daemon sets (a node's keys from its booted callback, StrictHostKeyChecking=yes; "
        "else the first key seen): ssh takes the first value, so these cannot turn it off")
    address_fallback: Literal["hostname", "none"] = Field(
        "hostname", description="Address of a node without facts.address: its hostname "
        "(resolved by DNS), or none (the step fails)")
    max_concurrency: int = Field(
        4, ge=1, description="Threads of the \"install\" pool: playbook runs at once; more wait")
    run_timeout_s: float = Field(3600.0, gt=0, description="A playbook run longer than "
                                 "this is killed and fails the step (retryable)")
    run_grace_s: float = Field(
        120.0, gt=0, description="Watchdog: a run not ended run_timeout_s + this after it "
        "started has its processes killed and fails the step (retryable); its \"install\" "
        "thread is abandoned until ansible-runner returns")
    forks: int = Field(5, ge=1, description="Ansible forks per run")
    keep_failed_runs: int = Field(
        3, ge=0, description="Private data dirs of failed runs kept per node for debugging "
        "(<state_dir>/ansible/<node>/); successful ones are removed")
    kubernetes_version: str = Field(
        "1.34.2", pattern=r"^\d+\.\d+\.\d+$",
        description="kubelet/kubeadm version installed from pkgs.k8s.io (pinned and held)")
    install_packages: bool = Field(
        True, description="Install packages (apt, pkgs.k8s.io); false: configure only what "
        "the image ships")
    extra_vars: dict[str, JsonValue] = Field(
        default_factory=dict, description="Extra variables for every run (never secrets)")
    profile_vars: dict[str, dict[str, JsonValue]] = Field(
        default_factory=dict, description="Extra variables per profile name, e.g. "
        "{ gpu-worker = { containerd_nvidia_toolkit = true } }")
