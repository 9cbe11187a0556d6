"""``provisioner completion bash|zsh``: the shell completion script, generated from this very
parser by shtab (https://github.com/iterative/shtab).

shtab writes a static script (every command, option and choice spelled out in it), so
nothing of provisioner runs when the operator presses Tab; argcomplete, the other well-kept
choice, calls back into Python on every Tab. The script is generated, never kept by hand: a
new command or option is in it with no edit here. Options that take a file (``--config``,
``--token-file``, ``FILE`` arguments) complete file names.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

SHELLS = ("bash", "zsh")


def add_commands(sub: Subcommands, root: argparse.ArgumentParser) -> None:
    """``completion SHELL``, which prints the script of ``root`` (the whole command line)."""
    completion = sub.add_parser(
        "completion", allow_abbrev=False,
        help="print the shell completion script (bash: source <(provisioner completion "
             "bash); zsh: into a file named _provisioner on $fpath)")
    completion.add_argument("shell", choices=SHELLS, metavar="SHELL",
                            help=", ".join(SHELLS))
    completion.set_defaults(command=functools.partial(cmd_completion, root))


def cmd_completion(root: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import shtab

    _complete_paths(root, shtab.FILE)
    print(shtab.complete(root, shell=args.shell))
    return 0


def _complete_paths(parser: argparse.ArgumentParser, files: object) -> None:
    """Mark every argument of type ``Path`` (here and in every command below) as a file
    name for shtab (its ``action.complete``)."""
    seen: set[int] = set()
    pending = [parser]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for action in current._actions:
            if action.type is Path:
                action.complete = files  # type: ignore[attr-defined]  # shtab's attribute
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
