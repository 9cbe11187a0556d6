"""The pure parts of provisioner.install and inventory/provisioner.py: event translation,
failure messages, error mapping, extra vars, the inventory, private data dirs."""

from __future__ import annotations

import importlib.util
import stat
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from provisioner.config import InstallSettings
from provisioner.domain import Node
from provisioner.errors import ConfigError, FatalError, RetryableError
from provisioner.ids import NodeId
from provisioner.install.ansible import scrub_env, secret_prompt
from provisioner.install.base import InstallEvent, PlayRecap, RunResult, TaskStatus
from provisioner.install.events import failure_message, raise_for, recap_from_stats, translate
from provisioner.install.installer import AnsibleInstaller, group_name, node_address
from provisioner.install.workdir import (
    create_run_dir_blocking,
    find_playbooks,
    finish_run_dir_blocking,
    safe_name,
)
from provisioner.lifecycle.states import NodeState

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def event(name: str, **data: Any) -> dict[str, Any]:
    return {"event": name, "created": "2025-05-01T12:00:00.5",
            "event_data": {"task": "Write /etc/hostname", "host": "gpu-1"} | data}


@pytest.mark.parametrize(("raw", "status", "message"), [
    (event("runner_on_ok", res={"changed": True}), TaskStatus.CHANGED, ""),
    (event("runner_on_ok", res={"changed": False}), TaskStatus.OK, ""),
    (event("runner_on_skipped"), TaskStatus.SKIPPED, ""),
    (event("runner_on_failed", res={"msg": "boom"}), TaskStatus.FAILED, "boom"),
    (event("runner_on_failed", ignore_errors=True, res={"msg": "meh"}), TaskStatus.OK,
     "failed (ignored): meh"),
    (event("runner_on_unreachable", res={"msg": "ssh: connect to host x port 22: Connection "
                                                "refused"}),
     TaskStatus.UNREACHABLE, "ssh: connect to host x port 22: Connection refused"),
], ids=["changed", "ok", "skipped", "failed", "ignored", "unreachable"])
def test_task_events_translate(raw: dict[str, Any], status: TaskStatus, message: str) -> None:
    [translated] = translate(raw)
    assert (translated.task, translated.host) == ("Write /etc/hostname", "gpu-1")
    assert (translated.status, translated.message) == (status, message)
    assert translated.when == datetime(2025, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)


def test_other_events_are_dropped_and_stats_become_recaps() -> None:
    assert translate({"event": "runner_on_start", "event_data": {}}) == []
    assert translate({"event": "verbose", "stdout": "x"}) == []
    stats = {"ok": {"a": 5, "b": 1}, "changed": {"a": 2}, "failures": {"b": 1},
             "dark": {}, "skipped": {"a": 3}, "rescued": {}, "ignored": {}}
    recaps = translate({"event": "playbook_on_stats", "event_data": stats})
    assert [(e.host, e.status, e.message) for e in recaps] == [
        ("a", TaskStatus.RECAP, "ok=5 changed=2 unreachable=0 failed=0 skipped=3 rescued=0 "
                                "ignored=0"),
        ("b", TaskStatus.RECAP, "ok=1 changed=0 unreachable=0 failed=1 skipped=0 rescued=0 "
                                "ignored=0")]
    assert recap_from_stats(stats)["a"] == PlayRecap(ok=5, changed=2, skipped=3)
    assert recap_from_stats(None) == {}


def test_failure_message_is_one_short_line() -> None:
    assert failure_message({"msg": "non-zero return code", "stderr": "a\nb\nc\nd", "rc": 2}
                           ) == "non-zero return code b / c / d (rc 2)"
    loop = {"msg": "One or more items failed", "results": [
        {"item": 1, "failed": False}, {"item": 2, "failed": True, "msg": "item two broke"}]}
    assert failure_message(loop) == "item two broke"
    assert len(failure_message({"msg": "x" * 2000})) == 500


def test_event_summary_and_what_is_recorded() -> None:
    changed = InstallEvent("Set it", "h", TaskStatus.CHANGED, "", NOW)
    assert changed.summary() == "Set it: changed" and changed.noteworthy
    failed = InstallEvent("Set it", "h", TaskStatus.FAILED, "boom", NOW)
    assert failed.summary() == "Set it: failed boom" and failed.noteworthy
    assert not InstallEvent("Look", "h", TaskStatus.OK, "", NOW).noteworthy
    assert not InstallEvent("Look", "h", TaskStatus.SKIPPED, "", NOW).noteworthy


def result(*failures: InstallEvent, status: str = "failed", tail: str = "") -> RunResult:
    return RunResult(status=status, rc=2, failures=failures, stdout_tail=tail)


def test_outcomes_map_to_retryable_or_fatal() -> None:
    raise_for(RunResult(status="successful", rc=0), "configure x")
    gone = InstallEvent("Gathering Facts", "h", TaskStatus.UNREACHABLE, "refused", NOW)
    with pytest.raises(RetryableError, match="^configure x: host h unreachable: refused$"):
        raise_for(result(gone), "configure x")
    task = InstallEvent("Check it", "h", TaskStatus.FAILED, "bad", NOW)
    with pytest.raises(FatalError, match="^configure x: task 'Check it' failed on h: bad$"):
        raise_for(result(task), "configure x")
    with pytest.raises(RetryableError, match="timed out"):
        raise_for(result(status="timeout"), "configure x")
    with pytest.raises(FatalError, match="rc 2: ERROR! the playbook could not be found"):
        raise_for(result(tail="...\nERROR! the playbook could not be found"), "configure x")


def test_scrub_env_drops_the_daemons_own_variables() -> None:
    parent = {"PATH": "/bin", "HOME": "/root", "PROVISIONER_DATABASE_URL": "pg://u:pw@h/d",
              "LC_ALL": "C", "ANSIBLE_FORKS": "3", "https_proxy": "http://p:3128",
              "AWS_SECRET_ACCESS_KEY": "k"}
    env = dict(parent) | {"PATH": "/venv/bin:/bin", "ANSIBLE_STDOUT_CALLBACK": "awx_display"}
    assert scrub_env(env, parent) == {
        "PATH": "/venv/bin:/bin", "HOME": "/root", "LC_ALL": "C", "ANSIBLE_FORKS": "3",
        "https_proxy": "http://p:3128", "ANSIBLE_STDOUT_CALLBACK": "awx_display"}


def test_secret_prompts_match_the_playbooks() -> None:
    for playbook, name in (("site.yml", "provisioner_agent_token"),
                           ("facts.yml", "provisioner_agent_token"),
                           ("join.yml", "kube_join_token")):
        assert f"prompt: {secret_prompt(name)}\n" in (ROOT / "playbooks" / playbook).read_text()


def node(**fields: Any) -> Node:
    values: dict[str, Any] = {
        "id": NodeId("6f1c0000-0000-4000-8000-000000000001"), "state": NodeState.CONFIGURING,
        "hostname": "gpu-01", "serial": "S1", "macs": (), "maintenance": False,
        "maintenance_reason": "", "profile": "gpu-worker", "rack": "r1", "position": None,
        "facts": {}, "last_error": "", "checkpoint": (), "version": 1, "history_seq": 4,
        "bmc": None, "created_at": NOW, "updated_at": NOW}
    return Node(**(values | fields))


def test_node_address_prefers_facts_then_hostname() -> None:
    assert node_address(node(facts={"address": " 10.0.0.5 "}), "hostname") == "10.0.0.5"
    assert node_address(node(), "hostname") == "gpu-01"
    with pytest.raises(FatalError, match="has no address"):
        node_address(node(), "none")
    with pytest.raises(FatalError, match="has no address"):
        node_address(node(hostname=None), "hostname")
    assert group_name("profile", "GPU-worker.v2") == "profile_gpu_worker_v2"


def test_inventory_and_variables_of_a_node(tmp_path: Path) -> None:
    key = tmp_path / "id"
    settings = InstallSettings(
        ssh_private_key_file=key, ssh_user="ops", ssh_port=2222,
        extra_vars={"kubernetes_version": "1.33.1", "provisioner_node_id": "forged", "a": 1},
        profile_vars={"gpu-worker": {"containerd_nvidia_toolkit": True, "a": 2}})
    installer = AnsibleInstaller(settings, runner=None)  # type: ignore[arg-type]
    target = node(facts={"address": "10.0.0.5"})
    inventory: Any = installer.inventory(target)
    hostvars = inventory["all"]["hosts"]["gpu-01"]
    assert hostvars["ansible_host"] == "10.0.0.5" and hostvars["ansible_port"] == 2222
    assert hostvars["ansible_user"] == "ops"
    assert hostvars["ansible_ssh_private_key_file"] == str(key)
    assert inventory["all"]["children"] == {"profile_gpu_worker": {"hosts": {"gpu-01": {}}}}
    values = installer.variables(target)
    assert values["kubernetes_version"] == "1.33.1" and values["a"] == 2
    assert values["containerd_nvidia_toolkit"] is True
    assert values["provisioner_node_id"] == target.id  # identity is never overridden
    assert values["provisioner_install_packages"] is True
    # reported by the machine: never templated by Ansible (test_attacks_bounds.py runs it)
    assert values["provisioner_serial"] == {"__ansible_unsafe": target.serial}


def test_run_dirs_are_private_kept_on_failure_and_pruned(tmp_path: Path) -> None:
    playbooks = find_playbooks(ROOT / "playbooks")
    root = tmp_path / "ansible"
    runs = [create_run_dir_blocking(root, "node-1", "node-1:5", playbooks,
                                    inventory={"all": {}}, extravars={"a": 1})
            for _ in range(3)]
    assert [r.path.name for r in runs] == ["node-1_5", "node-1_5.2", "node-1_5.3"]
    assert stat.S_IMODE(runs[0].path.stat().st_mode) == 0o700
    assert stat.S_IMODE((runs[0].path / "env" / "extravars").stat().st_mode) == 0o600
    assert (runs[0].path / "project" / "site.yml").is_file()
    assert runs[0].inventory.read_text().startswith("{")
    finish_run_dir_blocking(runs[2], ok=True, keep_failed=1)
    assert not runs[2].path.exists() and [p.name for p in (root / "node-1").iterdir()] == [
        "node-1_5.2"]
    finish_run_dir_blocking(runs[1], ok=False, keep_failed=0)
    assert not (root / "node-1").exists()
    assert safe_name("a/../b:c") == "a_.._b_c"


def test_playbooks_dir_must_hold_the_playbooks(tmp_path: Path) -> None:
    assert find_playbooks(None) == (ROOT / "playbooks").resolve()
    (tmp_path / "site.yml").write_text("[]")
    with pytest.raises(ConfigError, match=r"^install.playbooks_dir: .* lacks site.yml or "
                                          r"join.yml$"):
        find_playbooks(tmp_path)
    (tmp_path / "join.yml").write_text("[]")  # facts.yml is optional: site.yml stands in
    assert find_playbooks(tmp_path) == tmp_path.resolve()


def inventory_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pv_inventory", ROOT / "inventory" /
                                                  "provisioner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_inventory_script_groups_nodes() -> None:
    script = inventory_script()
    gpus = [{"vendor": "0x10de", "device": "0x2330", "name": "NVIDIA H100 80GB HBM3"}] * 8
    nodes = [
        {"id": "n1", "hostname": "gpu-01", "state": "active", "rack": "R-1", "profile": "gpu",
         "maintenance": True, "bmc": {"driver": "ipmi", "address": "10.9.0.1",
                                      "password_set": True},
         "facts": {"gpus": gpus, "address": "10.0.0.1"}},
        {"id": "n2", "hostname": None, "state": "discovered", "facts": {
            "last_report": {"gpus": [{"vendor": "0x10de", "device": "0x20b5"}]}}},
        # an older ramdisk's name: the device ID table names it
        {"id": "n3", "hostname": "gpu-03", "state": "inspected", "facts": {
            "gpus": [{"vendor": "0x10de", "device": "0x2330", "name": "NVIDIA 0x2330"}] * 8}},
        {"id": "n4", "hostname": "odd-04", "state": "inspected", "facts": {
            "gpus": [{"vendor": "0x1002", "device": "0x74a1"}]}},
    ]
    inventory = script.build(nodes)
    assert inventory["state_active"] == {"hosts": ["gpu-01"]}
    assert inventory["rack_r_1"] == {"hosts": ["gpu-01"]}
    assert inventory["gpu_nvidia_h100_80gb_hbm3"] == {"hosts": ["gpu-01", "gpu-03"]}
    assert inventory["gpu_nvidia_a100_80gb_pcie"] == {"hosts": ["n2"]}
    assert inventory["gpu_0x1002_0x74a1"] == {"hosts": ["odd-04"]}
    # every string among the host vars is Ansible's unsafe (never templated)
    assert inventory["_meta"]["hostvars"]["gpu-03"]["provisioner_gpu_model"] == {
        "__ansible_unsafe": "NVIDIA H100 80GB HBM3"}
    assert inventory["maintenance"] == {"hosts": ["gpu-01"]}
    one = inventory["_meta"]["hostvars"]["gpu-01"]
    assert one["ansible_host"] == {"__ansible_unsafe": "10.0.0.1"}
    assert one["provisioner_gpu_count"] == 8 and one["provisioner_maintenance"] is True
    assert one["provisioner_bmc_address"] == {"__ansible_unsafe": "10.9.0.1"}
    assert "ansible_host" not in inventory["_meta"]["hostvars"]["n2"]
    assert "_meta" not in inventory["all"]["children"]


@pytest.mark.parametrize("listen", ["127.0.0.1:8700", "0.0.0.0:9000", "[::]:8701",
                                    "[::1]:8702", "10.1.2.3:80", "mgmt.example:8700"])
def test_inventory_script_reads_listen_as_the_cli_does(listen: str) -> None:
    """The script cannot import the package: its few lines must agree with the CLI's."""
    from provisioner.cli.client import default_url
    from provisioner.config import Settings

    assert inventory_script().listen_url(listen) == default_url(
        Settings(api={"listen": listen}))  # type: ignore[arg-type]


def test_inventory_script_finds_the_daemon(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """PROVISIONER_URL, else the daemon's config (PROVISIONER_CONFIG, api.listen, which
    PROVISIONER_API__LISTEN overrides), else the script's own inventory.toml, else the
    CLI's default; the token from PROVISIONER_TOKEN(_FILE), else inventory.toml."""
    script = inventory_script()
    for name in ("PROVISIONER_URL", "PROVISIONER_TOKEN", "PROVISIONER_TOKEN_FILE",
                 "PROVISIONER_CONFIG", "PROVISIONER_API__LISTEN",
                 "PROVISIONER_INVENTORY_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(script, "DAEMON_CONFIG", tmp_path / "absent.toml")
    assert script.settings() == ("http://127.0.0.1:8700", None)  # nothing anywhere

    own = tmp_path / "home" / ".config" / "provisioner" / "inventory.toml"
    own.parent.mkdir(parents=True)
    (tmp_path / "tok").write_text("pvt_own\n")
    own.write_text(f'url = "http://own:8700/api/v1"\ntoken_file = "{tmp_path / "tok"}"\n')
    assert script.settings() == ("http://own:8700", "pvt_own")  # the documented fallback

    daemon = tmp_path / "provisioner.toml"
    daemon.write_text('[api]\nlisten = "0.0.0.0:9100"\n')
    monkeypatch.setattr(script, "DAEMON_CONFIG", daemon)  # /etc/provisioner/provisioner.toml
    assert script.settings() == ("http://127.0.0.1:9100", "pvt_own")
    named = tmp_path / "other.toml"
    named.write_text('state_dir = "/x"\n')  # no [api]: the default listen
    monkeypatch.setenv("PROVISIONER_CONFIG", str(named))
    assert script.settings()[0] == "http://127.0.0.1:8700"
    monkeypatch.setenv("PROVISIONER_API__LISTEN", "[::1]:9200")
    (tmp_path / "tok2").write_text("pvt_env\n")
    monkeypatch.setenv("PROVISIONER_TOKEN_FILE", str(tmp_path / "tok2"))
    assert script.settings() == ("http://[::1]:9200", "pvt_env")
    monkeypatch.setenv("PROVISIONER_URL", "http://given:1/")
    monkeypatch.setenv("PROVISIONER_TOKEN", "pvt_given")
    assert script.settings() == ("http://given:1", "pvt_given")

    monkeypatch.delenv("PROVISIONER_URL")
    monkeypatch.delenv("PROVISIONER_API__LISTEN")
    monkeypatch.setenv("PROVISIONER_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(script.InventoryError, match="missing.toml does not exist"):
        script.settings()
