"""Slurm node answers of every API version (recorded 22.05 answers and published v0.0.42/44
examples, tests/fixtures/slurm/README.md) → the same ``SlurmNode`` model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.slurm.model import SlurmNode, SlurmParseError
from provisioner.slurm.parse import (
    api_errors,
    node_from_openapi,
    node_from_scontrol,
    nodes_from_openapi,
    nodes_from_scontrol,
    state_from_text,
)
from provisioner.slurm.sync import foreign_drain

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def load(name: str) -> object:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize(("name", "expected"), [
    ("rest-v0.0.37-nodes-idle.json", ("gpu-node-01", "IDLE", {"DYNAMIC_NORM"}, "")),
    ("rest-v0.0.38-nodes-idle.json", ("gpu-node-01", "IDLE", {"DYNAMIC_NORM"}, "")),
    ("rest-v0.0.38-node-drained.json",
     ("gpu-node-01", "IDLE", {"DRAIN", "DYNAMIC_NORM"}, "ib link flapping")),
    ("rest-v0.0.38-node-down.json",
     ("gpu-node-01", "DOWN", {"DRAIN", "DYNAMIC_NORM"}, "slurmd stopped")),
    ("rest-v0.0.42-node-idle.json", ("host1", "IDLE", set(), "")),
    ("rest-v0.0.44-node-down.json", ("compute-0", "DOWN", {"DYNAMIC_NORM"}, "Not responding")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_every_version_parses_to_the_same_model(
        name: str, expected: tuple[str, str, set[str], str]) -> None:
    [node] = nodes_from_openapi(load(name))
    assert (node.name, node.state, set(node.flags), node.reason) == expected


def test_registration_and_drain_semantics() -> None:
    [idle] = nodes_from_openapi(load("rest-v0.0.38-nodes-idle.json"))
    [drained] = nodes_from_openapi(load("rest-v0.0.38-node-drained.json"))
    [down] = nodes_from_openapi(load("rest-v0.0.44-node-down.json"))
    assert idle.registered and not idle.draining
    assert drained.registered and drained.drained and drained.reason_user == "root"
    assert not down.registered
    assert down.not_registered_because() == "state DOWN+DYNAMIC_NORM"
    busy = SlurmNode("n", "MIXED", frozenset({"DRAIN"}))
    assert busy.draining and not busy.drained
    assert not SlurmNode("n", "IDLE", frozenset({"NOT_RESPONDING"})).registered
    assert not SlurmNode("n", "IDLE", frozenset({"INVALID_REG"})).registered
    assert not SlurmNode("n", "FUTURE").registered
    assert not SlurmNode("n", "IDLE", frozenset({"DRAIN", "COMPLETING"})).drained


def test_scontrol_one_line_form_matches_rest() -> None:
    idle, drained, down = nodes_from_scontrol(
        (FIXTURES / "scontrol-22.05-show-node.txt").read_text())
    assert [nodes_from_openapi(load(f"rest-v0.0.38-{n}.json"))[0]
            for n in ("nodes-idle", "node-drained", "node-down")] == [idle, drained, down]
    assert drained.reason == "ib link flapping" and drained.reason_user == "root"


@pytest.mark.parametrize(("text", "base", "flags"), [
    ("IDLE+DRAIN+DYNAMIC_NORM", "IDLE", {"DRAIN", "DYNAMIC_NORM"}),
    ("DOWN*+DRAIN", "DOWN", {"DRAIN", "NOT_RESPONDING"}),
    ("IDLE*", "IDLE", {"NOT_RESPONDING"}),
    ("idle", "IDLE", set()),
    ("MIXED+DRAIN", "MIXED", {"DRAIN"}),
    ("DRAIN", "UNKNOWN", {"DRAIN"}),
])
def test_state_text(text: str, base: str, flags: set[str]) -> None:
    assert state_from_text(text) == (base, frozenset(flags))


def test_reason_with_equals_sign_and_fields_after_it() -> None:
    line = ("NodeName=a State=IDLE+DRAIN Reason=fan=broken, see TICKET=42 [ops@2026-01-01T00:00:00]"
            " Comment=x")
    node = node_from_scontrol(line)
    assert (node.reason, node.reason_user) == ("fan=broken, see TICKET=42", "ops")


@pytest.mark.parametrize(("raw", "message"), [
    ([], "expected object"),
    ({"state": ["IDLE"]}, "without a name"),
    ({"name": "a", "state": 3}, "neither a string nor a list"),
    ({"name": "a", "state": "idle", "state_flags": "DRAIN"}, "not a list of strings"),
    ({"name": "a", "state": ["IDLE"], "reason": 5}, "expected string"),
])
def test_bad_node_entries_raise_parse_errors(raw: object, message: str) -> None:
    with pytest.raises(SlurmParseError, match=message):
        node_from_openapi(raw)


@pytest.mark.parametrize("text", ["State=IDLE", "NodeName=a Arch=x86_64", "NodeName=a State="])
def test_bad_scontrol_lines_raise_parse_errors(text: str) -> None:
    with pytest.raises(SlurmParseError):
        node_from_scontrol(text)


def test_no_nodes_and_errors() -> None:
    assert nodes_from_scontrol("No nodes in the system\n") == []
    with pytest.raises(SlurmParseError, match="no 'nodes' list"):
        nodes_from_openapi({"pings": []})
    assert api_errors(load("rest-v0.0.38-node-unknown.json")) == [
        "Invalid node name specified (errno 2018)"]
    assert api_errors({"errors": [{"description": "d", "error": "e", "error_number": 9}]}) == [
        "d: e (errno 9)"]


def test_foreign_drain_ignores_ours_and_slinkys() -> None:
    own = ("provisioner: ", "slurm-operator:")
    assert foreign_drain(SlurmNode("a", "IDLE", frozenset({"DRAIN"}), "provisioner: x"),
                         own) is None
    assert foreign_drain(SlurmNode("a", "IDLE", frozenset({"DRAIN"}), "slurm-operator: y"),
                         own) is None
    assert foreign_drain(SlurmNode("a", "IDLE", frozenset(), "old reason"), own) is None
    assert foreign_drain(SlurmNode("a", "MIXED", frozenset({"DRAIN"}), "ib", "bob"),
                         own) == "drained in Slurm by bob: ib"


async def test_scontrol_parses_only_the_lines_that_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At rest most of ``show node -o`` is what the last pass read: those lines are not
    parsed again, a changed line is, and a node gone from the listing is gone."""
    from provisioner.slurm import scontrol as module

    lines = [line.replace("gpu-node-01", f"gpu-node-{i:02d}") for i, line in enumerate(
        (line for line in (FIXTURES / "scontrol-22.05-show-node.txt").read_text().splitlines()
         if line.startswith("NodeName=")), start=1)]  # three states of one node, renamed
    listing = tmp_path / "listing"
    fake = tmp_path / "scontrol"  # prints the listing the test wrote: the parse is under test
    fake.write_text(f"#!/bin/sh\ncat {listing}\n")
    fake.chmod(0o755)
    client = module.ScontrolSlurm(scontrol=str(fake))
    parsed: list[str] = []
    real = module.node_from_scontrol

    def counted(line: str) -> SlurmNode:
        parsed.append(line)
        return real(line)

    monkeypatch.setattr(module, "node_from_scontrol", counted)
    listing.write_text("\n".join(lines) + "\n")
    first = await client.nodes()
    assert len(parsed) == len(lines)
    again = await client.nodes()
    assert again == first and len(parsed) == len(lines)
    changed = lines[0].replace("State=IDLE+DYNAMIC", "State=IDLE+DRAIN+DYNAMIC", 1)
    listing.write_text("\n".join([changed, *lines[2:]]) + "\n")
    last = await client.nodes()
    assert parsed[len(lines):] == [changed]
    assert [n.name for n in last] == [n.name for n in first if n.name != first[1].name]
    assert last[0].draining
