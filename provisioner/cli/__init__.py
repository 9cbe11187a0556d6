"""The ``provisioner`` command: ``serve``, local admin commands, and an HTTP client of the API.

``entry`` holds ``main`` and the top-level parser; each command group has its own module
(``serve``, ``db``, ``config``, ``tokens``, ``nodes``, ``power``, ``inventory``, ``topology``,
``ramdisk``, ``completion``); the groups share ``client`` (the HTTP client, the API options,
the settings behind ``--config``) and ``formatting`` (text for people). ``entry`` imports the
groups, the groups import only ``client`` and ``formatting``: no circle, and no private name
crosses a module (tests/unit/test_cli_modules.py checks both).

Exit codes: 0 ok, 1 an API or runtime failure (one line on stderr), 2 a usage or config error.
Heavy modules (pydantic, the store, the daemon) are imported only by the commands that need
them, so ``provisioner node list`` starts fast.
"""

from provisioner.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
