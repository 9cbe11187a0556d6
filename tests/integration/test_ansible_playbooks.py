"""The shipped playbooks over real SSH against a Debian root made by debootstrap.

The target (tests/peers/sshd.py): the cached debootstrap root under a per-test overlay, its
own sshd chrooted into it, in a network namespace and private mount/UTS/PID namespaces the
test creates. SSH into that root, not Ansible's chroot connection: modules run through the
target's sshd and python3 as on a real node. Tasks that would change the shared kernel (kernel
modules, sysctl, swap, running services) are off with ``provisioner_runtime: false``, and
package installs with ``install_packages = false`` (the target has no network; the root
ships the packages instead). Everything else runs for real.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from provisioner.config import ValidationSettings
from provisioner.errors import FatalError
from provisioner.install.base import AgentEndpoint, InstallEvent, TaskStatus
from provisioner.kube.join import JoinTicket
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.validation import SETTLE_EVENT, FactsValidator
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import wait_for_state
from tests.integration.ansible_support import (
    AgentApi,
    agent_api,
    conductor_with,
    make_installer,
    short_dir,
    target_settings,
)
from tests.peers.debootstrap import debootstrap_unavailable_reason
from tests.peers.ports import free_tcp_port
from tests.peers.sshd import ssh_node

pytestmark = [pytest.mark.root, pytest.mark.timeout(600)]
S = NodeState
RUN_DEADLINE_S = 180.0
IN_PROGRESS_XML = (Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "nvidia-smi"
                   / "h200-580.159.04-q-x.fabric-in-progress.xml").read_text()
TOKEN = "abcdef.0123456789abcdef"
CA_HASH = "sha256:" + "ab" * 32
FAKE_KUBEADM = """#!/bin/sh
# A stand-in for kubeadm: checks the JoinConfiguration, then writes kubelet.conf.
case "$1" in
  version) echo v1.34.2 ;;
  join)
    [ "$2" = --config ] && [ -f "$3" ] || { echo "usage: kubeadm join --config FILE" >&2; exit 2; }
    if grep -q 'token: "faild' "$3"; then
      echo "[preflight] Running pre-flight checks" >&2
      token=$(sed -n 's/.*token: "\\(.*\\)"/\\1/p' "$3")
      echo "error execution phase preflight: token $token rejected by the API server" >&2
      exit 1
    fi
    cp "$3" /root/kubeadm-join-seen.yaml
    mkdir -p /etc/kubernetes && echo "apiVersion: v1" > /etc/kubernetes/kubelet.conf
    echo "This node has joined the cluster" ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture(autouse=True)
def _needs_target() -> None:
    if (reason := debootstrap_unavailable_reason()) is not None:
        pytest.skip(reason)


def recaps(reasons: list[str]) -> list[int]:
    """``changed`` of each play recap in history reasons."""
    found = (re.search(r"^PLAY RECAP: .* changed=(\d+)", reason) for reason in reasons)
    return [int(match.group(1)) for match in found if match]


async def ansible_reasons(store: Store, node_id: str) -> list[str]:
    return [h.reason for h in await store.nodes.history(node_id) if h.event == "ansible"]


async def deploy_and_wait(store: Store, conductor: object, node_id: str) -> None:
    await conductor.fire(node_id, Event.DEPLOY, actor="test")  # type: ignore[attr-defined]
    node = await wait_for_state_any(store, node_id, {S.ACTIVE, S.CONFIGURE_FAILED})
    assert node.state is S.ACTIVE, node.last_error


async def wait_for_state_any(store: Store, node_id: str,
                             states: set[NodeState]):  # type: ignore[no-untyped-def]
    async with asyncio.timeout(RUN_DEADLINE_S):
        while True:
            node = await store.nodes.get(node_id)
            if node.state in states:
                return node
            await asyncio.sleep(0.1)


async def test_site_converges_then_changes_nothing_and_posts_facts(
        store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    with short_dir() as work, ssh_node(work / "node") as target:
        holder: list[AgentApi] = []  # the agent API needs the conductor, which needs us
        port = free_tcp_port()
        installer, pool = make_installer(
            target_settings(target), work / "state",
            agent=AgentEndpoint(f"http://127.0.0.1:{port}",
                                lambda node_id: holder[0].agents.issue_token(node_id)))
        conductor = conductor_with(store, world, installer)
        async with agent_api(store, conductor, work, port) as api:
            holder.append(api)
            node = await make_node(S.ACTIVE, hostname="gpu-ansible-01", serial=None,
                                   macs=(target.mac,), profile="gpu-worker")
            await store.nodes.merge_facts(node.id, {"address": target.address})

            started = time.monotonic()
            await deploy_and_wait(store, conductor, node.id)
            first_s = time.monotonic() - started
            first = await ansible_reasons(store, node.id)
            assert recaps(first) and recaps(first)[0] > 0, first
            assert any(r.startswith("Write /etc/hostname: changed") for r in first), first
            assert not any(": ok" in r for r in first), "ok tasks are not recorded"

            started = time.monotonic()
            await deploy_and_wait(store, conductor, node.id)
            second_s = time.monotonic() - started
            second = (await ansible_reasons(store, node.id))[len(first):]
            assert recaps(second) == [0], second
            print(f"site.yml: first run {first_s:.1f} s, second run {second_s:.1f} s")

            facts = (await store.nodes.get(node.id)).facts
            report = facts["last_report"]
            assert target.mac in [nic["mac"] for nic in report["nics"]]
            assert report["memory_mib"] > 0 and report["cpu"]["cores"] >= 1
        await conductor.stop()
        pool.shutdown()

        assert target.changed_file("/etc/hostname").read_text() == "gpu-ansible-01\n"
        containerd = target.changed_file("/etc/containerd/config.toml").read_text()
        assert "SystemdCgroup = true" in containerd
        assert 'default_runtime_name = "runc"' in containerd
        sysctl = target.changed_file("/etc/sysctl.d/90-kubernetes.conf").read_text()
        assert "net.ipv4.ip_forward = 1" in sysctl
        modules = target.changed_file("/etc/modules-load.d/kubernetes.conf").read_text()
        assert "br_netfilter" in modules
        assert "blacklist nouveau" in target.changed_file(
            "/etc/modprobe.d/blacklist-nouveau.conf").read_text()
        assert not (work / "state" / "ansible" / node.id).exists(), "successful runs are removed"


async def test_join_passes_the_ticket_and_keeps_the_token_off_disk(
        store: Store, make_node) -> None:  # type: ignore[no-untyped-def]
    with short_dir() as work, ssh_node(
            work / "node", {"/usr/local/bin/kubeadm": (FAKE_KUBEADM, 0o755)}) as target:
        events: list[InstallEvent] = []

        async def collect(node_id: str, event: InstallEvent) -> None:
            events.append(event)

        installer, pool = make_installer(target_settings(target), work / "state")
        installer.set_event_sink(collect)
        node = await make_node(S.JOINING, hostname="GPU-Join-01")
        await store.nodes.merge_facts(node.id, {"address": target.address})
        node = await store.nodes.get(node.id)

        bad = JoinTicket(server="https://10.77.0.1:6443", token="faild0.0123456789abcdef",
                         ca_cert_hashes=(CA_HASH,))
        with pytest.raises(FatalError) as failed:
            await installer.run_join(bad, node)
        message = str(failed.value)
        assert "Run kubeadm join" in message and "rejected" in message, message
        assert bad.token not in message and "<token>" in message
        assert target.removed("/etc/kubernetes/provisioner-join.yaml")
        kept = list((work / "state" / "ansible").rglob("*"))
        assert kept, "a failed run's private data dir is kept"
        assert not any(bad.token.encode() in p.read_bytes() for p in kept if p.is_file())

        ticket = JoinTicket(server="https://10.77.0.1:6443", token=TOKEN,
                            ca_cert_hashes=(CA_HASH,))
        await installer.run_join(ticket, node)
        seen = target.changed_file("/root/kubeadm-join-seen.yaml").read_text()
        assert f'token: "{TOKEN}"' in seen and 'apiServerEndpoint: "10.77.0.1:6443"' in seen
        assert CA_HASH in seen and 'name: "gpu-join-01"' in seen and "v1beta4" in seen
        assert target.removed("/etc/kubernetes/provisioner-join.yaml")

        events.clear()
        await installer.run_join(ticket, node)  # joined already: nothing to do
        recap = [e for e in events if e.status is TaskStatus.RECAP]
        assert len(recap) == 1 and "changed=0" in recap[0].message, recap
        assert all(TOKEN not in e.message for e in events)
        pool.shutdown()


async def test_failing_task_fails_with_the_task_name(
        store: Store, make_node) -> None:  # type: ignore[no-untyped-def]
    with short_dir() as work, ssh_node(work / "node") as target:
        settings = target_settings(target, extra_vars={"provisioner_runtime": False,
                                                       "kubernetes_version": "latest"})
        installer, pool = make_installer(settings, work / "state")
        node = await make_node(S.CONFIGURING, hostname="gpu-fail-01")
        await store.nodes.merge_facts(node.id, {"address": target.address})
        with pytest.raises(FatalError, match=r"task 'Check the Kubernetes version' failed on "
                           r"gpu-fail-01: kubernetes_version latest is not MAJOR\.MINOR\.PATCH"):
            await installer.configure(await store.nodes.get(node.id), "run-1")
        kept = work / "state" / "ansible" / node.id / "run-1"
        assert (kept / "artifacts" / "run" / "status").read_text() == "failed"
        pool.shutdown()


async def test_abort_cancels_the_running_playbook(
        store: Store, world: SimWorld, make_node, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "join.yml").write_text("- hosts: all\n  tasks: []\n")
    (playbooks / "facts.yml").write_text("- hosts: all\n  tasks: []\n")
    (playbooks / "site.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Start the long task\n      ansible.builtin.command: 'true'\n"
        "      changed_when: true\n"
        "    - name: Sleep on the node\n      ansible.builtin.command: sleep 120\n")
    with short_dir() as work, ssh_node(work / "node") as target:
        installer, pool = make_installer(
            target_settings(target, playbooks_dir=playbooks), work / "state")
        conductor = conductor_with(store, world, installer)
        node = await make_node(S.ACTIVE, hostname="gpu-abort-01")
        await store.nodes.merge_facts(node.id, {"address": target.address})
        await conductor.fire(node.id, Event.DEPLOY, actor="test")
        async with asyncio.timeout(60):
            while True:
                reasons = await ansible_reasons(store, node.id)
                if any(r.startswith("Start the long task: changed") for r in reasons):
                    break
                await asyncio.sleep(0.1)
        aborted = time.monotonic()
        await conductor.fire(node.id, Event.ABORT, actor="test", reason="operator")
        await wait_for_state(store, node.id, S.CONFIGURE_FAILED)
        run_dir = next((work / "state" / "ansible" / node.id).iterdir())
        async with asyncio.timeout(10):  # ansible-playbook and its (setsid) workers
            while True:
                if not running_with(str(run_dir)):
                    break
                await asyncio.sleep(0.1)
        stopped_s = time.monotonic() - aborted
        await conductor.stop()
        pool.shutdown()
        status = run_dir / "artifacts" / "run" / "status"
        async with asyncio.timeout(10):
            while True:
                if status.exists():
                    break
                await asyncio.sleep(0.1)
        assert status.read_text() == "canceled"
        assert stopped_s < 5, f"ansible-playbook still ran {stopped_s:.1f} s after abort"


def running_with(text: str) -> list[int]:
    """PIDs whose command line mentions ``text`` (the run's private data dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


async def test_a_settling_fabric_reruns_the_facts_playbook(
        store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    """Issue 22: a node validated with its NVSwitch fabric still ``In Progress`` (the H200
    capture, fabric edited) is not held at once: ``facts.yml`` runs over SSH, the role posts
    the target's real facts through the agent API, and the new report is judged (the target
    has no GPU: nothing left to hold it)."""
    with short_dir() as work, ssh_node(work / "node") as target:
        holder: list[AgentApi] = []
        port = free_tcp_port()
        installer, pool = make_installer(
            target_settings(target), work / "state",
            agent=AgentEndpoint(f"http://127.0.0.1:{port}",
                                lambda node_id: holder[0].agents.issue_token(node_id)))
        validator = FactsValidator(store.nodes, ValidationSettings(
            fabric_settle_timeout_s=RUN_DEADLINE_S, fabric_settle_interval_s=0.1))
        conductor = conductor_with(store, world, installer, validator)
        async with agent_api(store, conductor, work, port) as api:
            holder.append(api)
            node = await make_node(S.VALIDATING, hostname="gpu-ansible-03", serial=None,
                                   macs=(target.mac,), profile="gpu-worker")
            await store.nodes.merge_facts(node.id, {"address": target.address, "last_report": {
                "nvidia_smi_xml": IN_PROGRESS_XML}})
            await conductor.recover()
            done = await wait_for_state_any(store, node.id, {S.ACTIVE, S.VALIDATE_FAILED})
            assert done.state is S.ACTIVE, done.last_error
            assert target.mac in [nic["mac"] for nic in done.facts["last_report"]["nics"]]
            history = await store.nodes.history(node.id)
            assert [h.event for h in history].count(SETTLE_EVENT) == 1
            assert any(h.event == "facts_reported" for h in history)
            assert recaps(await ansible_reasons(store, node.id)), "facts.yml ran"
        await conductor.stop()
        pool.shutdown()

