"""Composition root (DESIGN §3): the only package that picks concrete drivers.

``serve``: the daemon's run (exit stack, TaskGroup, signals, systemd); ``drivers``: the
drivers each node gets (BMC, ports routed per node, rotation); ``clients``: Kubernetes,
Slurm, Ansible and image writing, when configured; ``servers``: API, boot services, the
PostgreSQL change listener; ``hooks``: what other systems report, into the conductor.
Nothing imports it except the CLI's ``serve`` command.
"""

from __future__ import annotations

from provisioner.daemon.drivers import rotate_if_opted_in as rotate_if_opted_in
from provisioner.daemon.serve import Daemon as Daemon
from provisioner.daemon.serve import run as run
