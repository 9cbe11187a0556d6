"""ansible-runner in the "install" pool, without a target: events as an async iterator,
secrets and the daemon's environment kept off disk, an unreachable host failing the step
quickly, ``ansible-playbook`` missing at startup."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from provisioner.errors import ConfigError, RetryableError
from provisioner.install.ansible import (
    AnsibleRunner,
    RunnerOptions,
    RunSpec,
    find_ansible_playbook,
)
from provisioner.install.base import TaskStatus
from provisioner.install.installer import AnsibleInstaller
from provisioner.install.workdir import one_host_inventory
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.watchdog import CallDeadlineExceeded
from tests.conftest import wait_for_state
from tests.integration.ansible_support import (
    conductor_with,
    make_installer,
    short_dir,
)
from tests.peers.ports import free_tcp_port

SECRET = "pvt_agent-token-value-1234567890"
DB_SECRET = "db-password-in-the-daemon-environment"
PLAYBOOK = """\
- hosts: all
  gather_facts: false
  vars_prompt:
    - name: provisioner_agent_token
      prompt: provisioner secret provisioner_agent_token
      private: true
      unsafe: true
  tasks:
    - name: Use the secret
      ansible.builtin.copy:
        content: "{{{{ provisioner_agent_token | hash('sha256') }}}}"
        dest: {digest}
    - name: Look around
      ansible.builtin.command: "true"
      changed_when: false
    - name: Fail on purpose
      ansible.builtin.fail:
        msg: stop here
"""


def playbooks(tmp: Path, site: str) -> Path:
    path = tmp / "playbooks"
    path.mkdir()
    (path / "site.yml").write_text(site)
    (path / "join.yml").write_text("- hosts: all\n  tasks: []\n")
    (path / "facts.yml").write_text("- hosts: all\n  tasks: []\n")
    return path


async def test_events_stream_and_secrets_stay_off_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_DATABASE_URL", f"postgresql://pv:{DB_SECRET}@db/pv")
    digest = tmp_path / "digest"
    options = RunnerOptions(state_dir=tmp_path / "state",
                            playbooks=playbooks(tmp_path, PLAYBOOK.format(digest=digest)),
                            binary=find_ansible_playbook(), timeout_s=120, forks=1,
                            keep_failed_runs=3)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    spec = RunSpec(node_id="node-1", run_id="node-1:7", playbook="site.yml",
                   inventory=one_host_inventory("gpu-local", local), extravars={"x": 1},
                   secrets={"provisioner_agent_token": SECRET})
    with ThreadPoolExecutor(1, thread_name_prefix="install") as pool:
        run = AnsibleRunner(options, pool).start(spec)
        events = [event async for event in run]
        result = await run.result()

    seen = [(e.task, e.status, e.message) for e in events]
    assert seen == [("Use the secret", TaskStatus.CHANGED, ""),
                    ("Look around", TaskStatus.OK, ""),
                    ("Fail on purpose", TaskStatus.FAILED, "stop here"),
                    ("PLAY RECAP", TaskStatus.RECAP, "ok=2 changed=1 unreachable=0 failed=1 "
                     "skipped=0 rescued=0 ignored=0")]
    assert all(e.host == "gpu-local" for e in events)
    assert result.status == "failed" and result.recap["gpu-local"].failed == 1
    assert digest.read_text() == hashlib.sha256(SECRET.encode()).hexdigest()
    kept = Path(result.private_data_dir)
    assert kept == tmp_path / "state" / "ansible" / "node-1" / "node-1_7"
    assert_nowhere_in(kept, SECRET, DB_SECRET)


def assert_nowhere_in(directory: Path, *secrets: str) -> None:
    files = [p for p in directory.rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in files)  # runner's record of the environment
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, path


async def test_unreachable_host_fails_the_step_quickly_with_the_reason(
        store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    from provisioner.config import InstallSettings

    closed = free_tcp_port()
    with short_dir() as work:
        settings = InstallSettings(ssh_port=closed, install_packages=False)
        installer, pool = make_installer(settings, work / "state")
        conductor = conductor_with(store, world, installer)
        node = await make_node(NodeState.ACTIVE, hostname="gpu-gone-01")
        await store.nodes.merge_facts(node.id, {"address": "127.0.0.1"})
        started = time.monotonic()
        await conductor.fire(node.id, Event.DEPLOY, actor="test")
        failed = await wait_for_state(store, node.id, NodeState.CONFIGURE_FAILED, 60)
        elapsed = time.monotonic() - started
        await conductor.stop()
        pool.shutdown()
    assert "host gpu-gone-01 unreachable" in failed.last_error
    assert f"port {closed}: Connection refused" in failed.last_error
    history = [h.reason for h in await store.nodes.history(node.id) if h.event == "ansible"]
    assert any(": unreachable " in reason for reason in history), history
    print(f"unreachable: step failed {elapsed:.1f} s after deploy")
    assert elapsed < 10, f"unreachable took {elapsed:.1f} s"


def test_missing_ansible_playbook_is_a_startup_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.config import InstallSettings

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    with pytest.raises(ConfigError, match="ansible-playbook not found on PATH nor in "):
        AnsibleInstaller.create(InstallSettings(), state_dir=tmp_path, pool=ThreadPoolExecutor(1))


def test_daemon_refuses_to_start_without_ansible_playbook(tmp_path: Path) -> None:
    """The daemon under the base interpreter (no venv bin beside it) and a PATH without
    ansible-playbook: exit code 2 and one clear line, not a node failing later with rc 127."""
    python = Path(sys.base_prefix) / "bin" / "python3"
    path = "/usr/sbin:/usr/bin:/sbin:/bin"
    if (python.parent / "ansible-playbook").exists() or any(
            (Path(d) / "ansible-playbook").exists() for d in path.split(":")):
        pytest.skip("ansible-playbook is installed system-wide here")
    root = Path(__file__).resolve().parents[2]
    config = tmp_path / "provisioner.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                      f'[api]\nlisten = "127.0.0.1:{free_tcp_port()}"\n')
    env = {"PATH": path, "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "PYTHONPATH": f"{root}:{sysconfig.get_paths()['purelib']}"}
    result = subprocess.run([str(python), "-m", "provisioner", "--config", str(config), "serve"],
                            capture_output=True, text=True, timeout=60, env=env, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "cannot start: ansible-playbook not found on PATH nor in" in result.stderr
    assert "install ansible-core" in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "state")  # refused before writing anything (preflight)


async def test_a_run_past_the_watchdog_deadline_is_killed_and_fails_retryably(
        tmp_path: Path) -> None:
    """A playbook whose task outlives the watchdog's deadline (set below runner's own
    timeout, so the watchdog acts, not runner): the run fails CallDeadlineExceeded on time,
    its processes (the task's ``sleep`` too) are killed, its thread comes back."""
    sleep = "61.25"  # a command line no other process on the machine has
    site = ("- hosts: all\n  gather_facts: false\n  tasks:\n"
            f"    - name: Hang\n      ansible.builtin.command: sleep {sleep}\n")
    options = RunnerOptions(state_dir=tmp_path / "state", playbooks=playbooks(tmp_path, site),
                            binary=find_ansible_playbook(), timeout_s=300, forks=1,
                            keep_failed_runs=1, deadline_s=4.0, pool_slots=1)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    spec = RunSpec(node_id="node-1", run_id="node-1:1", playbook="site.yml",
                   inventory=one_host_inventory("gpu-local", local), extravars={})
    with ThreadPoolExecutor(1, thread_name_prefix="install") as pool:
        runner = AnsibleRunner(options, pool)
        started = time.monotonic()
        with pytest.raises(CallDeadlineExceeded, match=r"ansible-runner site\.yml for node "
                           r"node-1: no result within its 4 s deadline") as caught:
            await runner.run(spec)
        assert isinstance(caught.value, RetryableError)
        assert 4.0 <= time.monotonic() - started < 12.0  # the deadline, not the task's 61 s
        assert await poll_for(lambda: not processes_named(sleep), 10), "task not killed"
        assert await poll_for(lambda: runner.hung_runs == 0, 10), "thread never returned"


def processes_named(needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return [pid for pid in found if pid != os.getpid()]


async def poll_for(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True
