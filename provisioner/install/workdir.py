"""Private data dirs of ansible-runner: one per run under ``<state_dir>/ansible/<node>/<run>/``.

Layout: ``project/`` (a copy of the playbooks, so a kept run shows exactly what ran),
``inventory/hosts.json`` (the one node: address, SSH user, key path), ``env/extravars``
(non-secret variables only) and ``artifacts/`` (runner's events and stdout). Secrets never
land here: they answer ``vars_prompt`` prompts through runner's ``passwords`` (see
``ansible.py``). A successful run's dir is removed; failed ones are kept for debugging, the
newest ``keep_failed`` per node. Blocking helpers: they run in the "install" pool.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioner import shipped
from provisioner.errors import ConfigError

log = logging.getLogger(__name__)
PLAYBOOKS: tuple[str, ...] = ("site.yml", "join.yml")
FACTS_PLAYBOOK = "facts.yml"
"""Optional in a site's own playbooks dir: without it, facts are collected again with the
idempotent ``site.yml`` (whose ``facts`` role posts them)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; ssh appends "/" + a 40-character hash


def shipped_playbooks_candidates() -> list[Path]:
    """Where the playbooks shipped with provisioner live: next to the package (a source
    checkout or editable install), the wheel's package data, the data dirs of an install
    (``provisioner.shipped``)."""
    return shipped.candidates("playbooks")


def find_playbooks(configured: Path | None) -> Path:
    """The playbooks dir to use; ConfigError naming the key when it lacks a playbook."""
    candidates = [configured] if configured is not None else shipped_playbooks_candidates()
    for candidate in candidates:
        if all((candidate / name).is_file() for name in PLAYBOOKS):
            return candidate.resolve()
    if configured is not None:
        raise ConfigError(f"install.playbooks_dir: {configured} lacks "
                          f"{' or '.join(PLAYBOOKS)}")
    raise ConfigError("install.playbooks_dir: no shipped playbooks found in "
                      + ", ".join(str(path) for path in candidates) + "; set it")


def safe_name(text: str) -> str:
    """A path component from an id (run ids carry ``:``)."""
    return _UNSAFE.sub("_", text).strip("._") or "_"


@dataclass(frozen=True, slots=True)
class RunDir:
    path: Path
    node_dir: Path

    @property
    def inventory(self) -> Path:
        return self.path / "inventory" / "hosts.json"


def create_run_dir_blocking(root: Path, node_id: str, run_id: str, playbooks: Path, *,
                            inventory: Mapping[str, object],
                            extravars: Mapping[str, object]) -> RunDir:
    """A fresh private data dir (mode 0700). A dir left by an earlier attempt of the same run
    (a crash) is kept for debugging: this one gets a ``.N`` suffix."""
    node_dir = root / safe_name(node_id)
    node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    base = safe_name(run_id)
    path, attempt = node_dir / base, 1
    while path.exists():
        attempt += 1
        path = node_dir / f"{base}.{attempt}"
    path.mkdir(mode=0o700)
    shutil.copytree(playbooks, path / "project", symlinks=True,
                    ignore=shutil.ignore_patterns("*.retry", "__pycache__"))
    _write_json(path / "inventory" / "hosts.json", inventory)
    _write_json(path / "env" / "extravars", extravars)
    return RunDir(path=path, node_dir=node_dir)


def _write_json(path: Path, data: Mapping[str, object]) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)


def finish_run_dir_blocking(run: RunDir, *, ok: bool, keep_failed: int) -> None:
    """Remove a successful run's dir; keep a failed one, pruning the node's older ones."""
    if ok:
        shutil.rmtree(run.path, ignore_errors=True)
    else:
        log.info("ansible run kept for debugging: %s", run.path)
    prune_blocking(run.node_dir, keep=keep_failed)


def prune_blocking(node_dir: Path, *, keep: int) -> list[Path]:
    """Remove all but the ``keep`` newest run dirs of a node; return the removed ones."""
    try:
        runs = sorted((entry for entry in node_dir.iterdir() if entry.is_dir()),
                      key=lambda entry: entry.stat().st_mtime, reverse=True)
    except FileNotFoundError:
        return []
    removed = runs[keep:]
    for old in removed:
        shutil.rmtree(old, ignore_errors=True)
    if not any(node_dir.iterdir()):
        node_dir.rmdir()
    return removed


def control_path_dir_blocking(root: Path) -> Path:
    """A dir for ssh ControlMaster sockets: ``<root>/cp`` when its path is short enough
    for a Unix socket, else a private temporary dir (mode 0700)."""
    preferred = root / "cp"
    if len(str(preferred)) + 41 <= _SOCKET_PATH_MAX:
        preferred.mkdir(parents=True, exist_ok=True, mode=0o700)
        return preferred
    return Path(tempfile.mkdtemp(prefix="provisioner-cp-"))


def one_host_inventory(alias: str, hostvars: Mapping[str, object],
                       groups: Sequence[str] = ()) -> dict[str, object]:
    """A YAML/JSON inventory with one host, also placed in ``groups``."""
    children: dict[str, object] = {group: {"hosts": {alias: {}}} for group in groups}
    return {"all": {"hosts": {alias: dict(hostvars)}, "children": children}}
