"""The SSH host keys Ansible accepts from a node: pinned, never "whatever answers".

The deployed OS's ``booted`` callback (cloud-init's ``runcmd`` from our seed, over the
node's agent token, from the address that token is bound to, while the deploy step waits)
carries the OS's host public keys; ``AgentService.callback`` stores them in
``facts.ssh_host_keys`` with a fresh ``facts.ssh_known_hosts_id``. Each Ansible run of the
node then uses its own known_hosts file, ``<state_dir>/ansible/known_hosts/<node>-<id>``,
under a ``HostKeyAlias`` that names the node (not its address):

- keys delivered: the file holds exactly them and ssh runs with
  ``StrictHostKeyChecking=yes``: a machine without one of those private keys is refused;
- no keys (an installer or an image whose callback sends none): ``accept-new`` on that
  file: the key seen at the first connection, made to the address our DHCP server bound,
  is the only one later runs (``join.yml`` with the bootstrap token) accept. A new deploy
  (a new callback) starts a new file.

These options come first on ssh's command line, so they win over ``install.ssh_common_args``
(ssh takes the first value of each option).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from provisioner.domain import Node

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def host_alias(node: Node) -> str:
    return "provisioner-" + _SAFE.sub("_", node.id)


def known_hosts_blocking(node: Node, state_dir: Path) -> str:
    """Write the node's known_hosts file (see above); return the ssh options that use it."""
    folder = state_dir / "ansible" / "known_hosts"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw_id = node.facts.get("ssh_known_hosts_id")
    epoch = _SAFE.sub("_", raw_id)[:32] if isinstance(raw_id, str) and raw_id else "none"
    name = f"{_SAFE.sub('_', node.id)}-{epoch}"
    path = folder / name
    keys = [key for key in node.facts.get("ssh_host_keys") or [] if isinstance(key, str)]
    alias = host_alias(node)
    if keys:
        text = "".join(f"{alias} {' '.join(key.split()[:2])}\n" for key in keys)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    for old in folder.glob(f"{_SAFE.sub('_', node.id)}-*"):
        if old.name != name:  # an earlier deploy's keys
            old.unlink(missing_ok=True)
    checking = "yes" if keys else "accept-new"
    return (f"-o HostKeyAlias={alias} -o UserKnownHostsFile={path} "
            f"-o StrictHostKeyChecking={checking}")
