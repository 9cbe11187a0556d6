"""``provisioner topology export``: the fabric topology from recorded tool output (offline);
``provisioner topology show``: the daemon's live topology (``GET /api/v1/topology``).

    provisioner topology export --ibnetdiscover FILE [--nvidia-smi-dir DIR]
        --format tree|block|yaml|labels|slinky [--block-size N] [--topology tree|block]
    provisioner topology show [--json] [--format tree|block|yaml|labels|slinky]

Writes to stdout; findings (warnings) go to stderr. Exit codes: 0 ok, 1 nothing could be
placed, 2 unparsable or unreadable input (one line saying which file, line and why).
In ``--nvidia-smi-dir`` each file is ``<hostname>.xml`` (``-q -x``), ``<hostname>.txt``
(``-q``, or the ``--query-gpu`` CSV) or ``<hostname>.csv``. The topology modules are imported
only when the command runs, so the rest of the CLI starts as fast as before.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.cli import formatting
from provisioner.cli.client import API, add_group, api_client, api_options

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands
    from provisioner.topology.model import Finding, Fleet, GpuReport

FORMATS = ("tree", "block", "yaml", "labels", "slinky")
GPU_SUFFIXES = (".xml", ".txt", ".csv")
_MAX_FILE_BYTES = 256 * 1024 * 1024


class InputError(Exception):
    """An input file that cannot be read or parsed: exit 2 with this one-line reason."""


def add_commands(sub: Subcommands) -> None:
    commands = add_group(sub, "topology", "fabric topology (offline export, or the daemon's "
                         "live one)")
    export = commands.add_parser(
        "export", allow_abbrev=False,
        help="topology.conf / topology.yaml / node labels from recorded ibnetdiscover and "
             "nvidia-smi output")
    export.add_argument("--ibnetdiscover", type=Path, required=True, metavar="FILE",
                        help="ibnetdiscover output (default, -p or -l form); - for stdin")
    export.add_argument("--nvidia-smi-dir", type=Path, metavar="DIR",
                        help="<hostname>.xml|.txt|.csv files of nvidia-smi output")
    export.add_argument("--format", required=True, choices=FORMATS)
    export.add_argument("--block-size", type=_positive, metavar="N",
                        help="planning base block size (default: the smallest block)")
    export.add_argument("--topology", choices=("tree", "block"),
                        help="the kind named 'default' in yaml and slinky output (default: "
                             "block when some node has an NVLink clique, else tree)")
    export.add_argument("--known-hosts", type=Path, metavar="FILE",
                        help="hostnames (or hostlist expressions), one per line: HCAs naming "
                             "other hosts are reported, not placed")
    export.add_argument("--quiet", action="store_true", help="do not print findings")
    export.set_defaults(command=cmd_topology_export)

    show = commands.add_parser("show", parents=[api_options()], allow_abbrev=False,
                               help="the daemon's live topology (through the API)")
    output = show.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="the API's JSON")
    output.add_argument("--format", choices=FORMATS,
                        help="print one published output instead of the summary")
    show.set_defaults(command=cmd_topology_show)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1, got {text!r}")
    return int(text)


def cmd_topology_export(args: argparse.Namespace) -> int:
    from provisioner.topology.model import Severity, TopologyParseError

    try:
        fleet = load_fleet(args.ibnetdiscover, args.nvidia_smi_dir, args.known_hosts)
    except (InputError, TopologyParseError) as exc:
        print(f"provisioner: error: {exc}", file=sys.stderr)
        return 2
    output, findings = render(fleet, args.format, args.block_size, args.topology)
    if not args.quiet:
        for finding in findings:
            if finding.severity is not Severity.INFO:
                print(f"provisioner: {finding}", file=sys.stderr)
    if not any(n.leaf or n.clique for n in fleet.nodes):
        print("provisioner: error: nothing to emit: no host is placed in the fabric or in an "
              "NVLink domain", file=sys.stderr)
        return 1
    sys.stdout.write(output)
    return 0


def load_fleet(ibnetdiscover: Path, gpu_dir: Path | None, known: Path | None) -> Fleet:
    from provisioner.topology.fabric import build_fabric
    from provisioner.topology.fleet import build_fleet
    from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover

    known_hosts = _known_hosts(known) if known is not None else None
    text = _read(ibnetdiscover)
    scan = parse_ibnetdiscover(text, source=str(ibnetdiscover))
    fabric = build_fabric(scan, known_hosts)
    reports = _gpu_reports(gpu_dir) if gpu_dir is not None else []
    return build_fleet(fabric, reports, known_hosts)


def _read(path: Path) -> str:
    try:
        if str(path) == "-":
            return sys.stdin.read(_MAX_FILE_BYTES)
        with open(path, encoding="utf-8") as handle:
            return handle.read(_MAX_FILE_BYTES)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None


def _gpu_reports(directory: Path) -> list[GpuReport]:
    from provisioner.topology.parse_nvsmi_text import parse_nvidia_smi

    try:
        paths = sorted(p for p in directory.iterdir() if p.suffix in GPU_SUFFIXES)
    except OSError as exc:
        raise InputError(f"{directory}: {exc.strerror or exc}") from None
    return [parse_nvidia_smi(_read(path), path.stem, source=str(path)) for path in paths]


def _known_hosts(path: Path) -> set[str]:
    from provisioner.topology.hostlist import HostlistError, expand

    hosts: set[str] = set()
    for number, line in enumerate(_read(path).splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            hosts.update(expand(entry))
        except HostlistError as exc:
            raise InputError(f"{path}: line {number}: {exc}") from None
    return hosts


def render(fleet: Fleet, fmt: str, block_size: int | None,
           topology: str | None) -> tuple[str, list[Finding]]:
    from provisioner.topology import emit

    tree = emit.plan_tree(fleet)
    blocks = emit.plan_blocks(fleet, block_size)
    kind = topology or ("block" if any(n.clique for n in fleet.nodes) else "tree")
    findings = list(fleet.findings)
    if fmt == "tree":
        return emit.tree_conf(tree), findings + list(tree.findings)
    if fmt == "block":
        return emit.block_conf(blocks), findings + list(blocks.findings)
    if fmt == "yaml":
        text = emit.topology_yaml(tree, blocks, default=kind)
        return text, findings + list(tree.findings) + list(blocks.findings)
    if fmt == "labels":
        return _json(emit.topograph_labels(fleet)), findings
    if kind == "block":
        return _json(emit.slinky_annotations(fleet, blocks=blocks)), findings + list(
            blocks.findings)
    return _json(emit.slinky_annotations(fleet, tree=tree)), findings + list(tree.findings)


def _json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def cmd_topology_show(args: argparse.Namespace) -> int:
    """Exit 0, or 1 when ``--format`` has nothing to print (no host placed)."""
    topology = api_client(args).get(f"{API}/topology")
    if args.json:
        print(formatting.dump_json(topology))
        return 0
    outputs = topology.get("outputs") or {}
    if args.format is not None:
        placed = any(n.get("leaf") or n.get("clique") for n in topology.get("nodes") or [])
        if not placed:
            print("provisioner: error: nothing to emit: no member host is placed in the "
                  "fabric or in an NVLink domain", file=sys.stderr)
            return 1
        value = outputs.get(args.format)
        sys.stdout.write(value if isinstance(value, str) else _json(value))
        return 0
    print(summary(topology))
    return 0


def summary(topology: dict[str, Any]) -> str:
    """The live topology for people: a headline, the nodes, the issues, the publications."""
    from provisioner.cli.formatting import table, text, timestamp

    def items(key: str) -> list[dict[str, Any]]:
        value = topology.get(key)
        return [item for item in value if isinstance(item, dict)] if isinstance(value, list) \
            else []

    nodes, issues, published = items("nodes"), items("issues"), items("published")
    digest = str(topology.get("digest") or "")[:12]
    lines = [f"topology/{topology.get('format')}  digest {digest}  computed "
             f"{timestamp(topology.get('computed_at'))}  {len(items('switches'))} switches  "
             f"{len(items('domains'))} NVLink domains  {len(nodes)} nodes", ""]
    lines.append(table(("HOSTNAME", "LEAF", "PATH", "NVLINK", "DOMAIN", "HEALTH", "GPUS",
                        "SPEC"),
                       [(text(n.get("hostname")), text(n.get("leaf")),
                         "/".join(str(p) for p in n.get("path") or []) or "-",
                         text(n.get("nvlink")), text(n.get("clique")), text(n.get("health")),
                         text(n.get("gpus")), text(n.get("spec"))) for n in nodes]))
    if issues:
        lines += ["", table(("SEVERITY", "CODE", "SUBJECT", "DETAIL"),
                            [(text(i.get("severity")), text(i.get("code")),
                              text(i.get("subject")), text(i.get("detail"))) for i in issues])]
    if published:
        lines += ["", table(("SINK", "DIGEST", "AT", "PENDING", "ERROR"),
                            [(text(p.get("sink")), str(p.get("digest") or "-")[:12],
                              timestamp(p.get("at")), "yes" if p.get("pending") else "no",
                              text(p.get("error") or None)) for p in published])]
    return "\n".join(lines)
