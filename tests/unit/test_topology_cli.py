"""``provisioner topology export`` (offline): formats, exit codes, one-line reasons."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisioner.cli import main
from tests.topology_support.nvsmi import CLUSTER_A, FIXTURES

HEALTHY = FIXTURES / "infiniband-sim/healthy/ibnetdiscover.txt"
NVL = FIXTURES / "synthetic/nvidia-smi-nvl"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["topology", "export", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_tree(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--ibnetdiscover", str(HEALTHY), "--format", "tree")
    assert code == 0 and not err
    assert "SwitchName=ib-spine-01 Switches=ib-leaf-[01-04]\n" in out
    assert "SwitchName=ib-leaf-04 Nodes=gpu-node-[13-16]\n" in out


def test_block_with_nvidia_smi_dir(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--ibnetdiscover", str(HEALTHY), "--nvidia-smi-dir", str(NVL),
                         "--format", "block", "--block-size", "8")
    assert code == 0
    assert f"BlockName={CLUSTER_A}.1 Nodes=gpu-node-[01-08]\n" in out
    assert out.rstrip().endswith("BlockSizes=8")
    assert "block-too-small" in err and "gpu-node-13: no NVLink clique" in err


def test_yaml_labels_slinky(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--ibnetdiscover", str(HEALTHY), "--nvidia-smi-dir", str(NVL), "--quiet"]
    code, out, err = run(capsys, *base, "--format", "yaml")
    document = yaml.safe_load(out)
    assert code == 0 and not err and [t["topology"] for t in document] == ["default", "tree"]
    code, out, _ = run(capsys, *base, "--format", "labels")
    labels = json.loads(out)
    assert labels["gpu-node-05"]["accelerator.topograph.run/domain"] == f"{CLUSTER_A}.1"
    assert labels["gpu-node-16"] == {"fabric.topograph.run/tier-0": "ib-leaf-04",
                                     "fabric.topograph.run/tier-1": "ib-spine-01"}
    code, out, _ = run(capsys, *base, "--format", "slinky")
    assert json.loads(out)["gpu-node-12"] == f"default:{CLUSTER_A}.2"
    code, out, _ = run(capsys, *base, "--format", "slinky", "--topology", "tree")
    assert json.loads(out)["gpu-node-12"] == "default:ib-spine-01:ib-leaf-03"


def test_known_hosts_and_stdin(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    known = tmp_path / "hosts"
    known.write_text("# the first rack\ngpu-node-[01-08]\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO(HEALTHY.read_text()))
    code, out, err = run(capsys, "--ibnetdiscover", "-", "--format", "tree",
                         "--known-hosts", str(known))
    assert code == 0 and "gpu-node-09" not in out and "unknown-host" in err
    known.write_text("gpu-node-[01-\n")
    code, _, err = run(capsys, "--ibnetdiscover", str(HEALTHY), "--format", "tree",
                       "--known-hosts", str(known))
    assert code == 2 and "line 1" in err


@pytest.mark.parametrize(("args", "reason"), [
    (["--ibnetdiscover", str(FIXTURES / "nvidia-smi/telegraf-rtx-3060-v12.xml")],
     "line 1: not an ibnetdiscover line"),
    (["--ibnetdiscover", "/nonexistent/file"], "No such file or directory"),
    (["--ibnetdiscover", str(HEALTHY), "--nvidia-smi-dir", str(FIXTURES / "nvidia-smi")],
     "gpud-nvidia-smi-nvlink-status.a100.txt (csv): line 1"),
    (["--ibnetdiscover", str(HEALTHY), "--nvidia-smi-dir", "/nonexistent"],
     "No such file or directory"),
])
def test_unparsable_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                                args: list[str], reason: str) -> None:
    code, out, err = run(capsys, *args, "--format", "tree")
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("provisioner: error: ") and reason in err


def test_nothing_to_emit_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--ibnetdiscover",
                         str(FIXTURES / "infiniband/topograph-ibnetdiscover-example-bad.out"),
                         "--format", "tree")
    assert code == 1 and not out
    assert "sees no switch" in err and err.rstrip().endswith(
        "nothing to emit: no host is placed in the fabric or in an NVLink domain")


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "export", "--ibnetdiscover", str(HEALTHY), "--format", "x"]) == 2
    assert main(["topology", "export", "--ibnetdiscover", str(HEALTHY), "--format", "block",
                 "--block-size", "0"]) == 2
    capsys.readouterr()


def test_console_script() -> None:
    script = Path(sys.executable).parent / "provisioner"
    result = subprocess.run([str(script), "topology", "export", "--ibnetdiscover",
                             str(FIXTURES / "infiniband-sim/faults/ibnetdiscover.txt"),
                             "--format", "tree"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0
    assert "SwitchName=ib-spine-02 Switches=ib-leaf-[01-02,04]" in result.stdout
    assert "ib-leaf-03: 1 uplinks" in result.stderr
