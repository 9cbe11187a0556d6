#!/usr/bin/env python3
"""Ansible dynamic inventory backed by the provisioner daemon's REST API (standard library only).

    ansible-inventory -i inventory/provisioner.py --list
    ansible-playbook -i inventory/provisioner.py site.yml --limit state_active

Where the daemon is, found as the ``provisioner`` CLI finds it: ``PROVISIONER_URL``, else
the daemon's own config (``PROVISIONER_CONFIG``, default ``/etc/provisioner/provisioner.toml``:
its ``[api] listen``, which ``PROVISIONER_API__LISTEN`` overrides, a wildcard address read as
127.0.0.1). The token: ``PROVISIONER_TOKEN`` or ``PROVISIONER_TOKEN_FILE``; a viewer token is
enough. Fallback, for a controller without the daemon's config: a TOML file of the script's
own (``PROVISIONER_INVENTORY_CONFIG``, which wins over the daemon's config when set; else
``~/.config/provisioner/inventory.toml`` then ``/etc/provisioner/inventory.toml``) with
``url = "http://host:8700"`` and ``token_file = "/path"`` (or ``token``). With none of these:
``http://127.0.0.1:8700``, the CLI's default.

One request per page of nodes (``GET /api/v1/nodes?include=facts``; 500 a page, or
``PROVISIONER_INVENTORY_PAGE``); a daemon older than that parameter answers 422, and the
script then reads each node's facts on its own.

Groups: ``state_<state>``, ``rack_<rack>``, ``profile_<profile>``, ``gpu_<model>`` (from the
node's facts, e.g. ``gpu_nvidia_h100_80gb_hbm3``) and ``maintenance``. Hosts are named by
hostname (the node id without one). Host vars: ``provisioner_node_id``, ``_serial``,
``_state``, ``_rack``, ``_position``, ``_profile``, ``_maintenance``, ``_macs``, ``_bmc_driver``,
``_bmc_address`` (never a BMC password: the API has none to give), ``_gpu_model``,
``_gpu_count``, and ``ansible_host`` when the facts carry the node's ``address``.

Every string among the host vars is marked unsafe (``{"__ansible_unsafe": "..."}``, which
ansible-core's inventory script plugin reads as a string never templated): a node's serial
or GPU names are what a machine on the provisioning network reported, and a reported
``{{ lookup('pipe', ...) }}`` would otherwise run on the controller as soon as a play used
the variable. The values are shown and used literally.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

try:
    from provisioner.agent.gpu_ids import device_id, model_name
except ImportError:  # run from a checkout without the package installed: the repo's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        from provisioner.agent.gpu_ids import device_id, model_name
    except ImportError:  # copied away from both: names as the facts give them
        def device_id(text: str) -> int | None:
            return None

        def model_name(device: int | str) -> str:
            return f"NVIDIA {device}"

API = "/api/v1"
PAGE = 500
TIMEOUT_S = 30.0
DETAIL_THREADS = 8
#: what the list is asked to carry (``GET /nodes?include=facts``)
INCLUDE = "facts"
_UNSAFE = re.compile(r"[^a-z0-9]+")


class InventoryError(Exception):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, 0 when no response came back


#: the daemon's config, as the CLI reads it (provisioner/config/load.py DEFAULT_CONFIG_PATH)
DAEMON_CONFIG = Path("/etc/provisioner/provisioner.toml")
DEFAULT_LISTEN = "127.0.0.1:8700"  # provisioner/config/runtime.py ApiSettings.listen


def settings() -> tuple[str, str | None]:
    """(base URL, token): the environment, else the daemon's config, else this script's own
    inventory.toml, else the CLI's default address."""
    url = os.environ.get("PROVISIONER_URL")
    token = os.environ.get("PROVISIONER_TOKEN")
    token_file = os.environ.get("PROVISIONER_TOKEN_FILE")
    own: dict[str, Any] = {} if url and (token or token_file) else _config_file()
    if not url and not os.environ.get("PROVISIONER_INVENTORY_CONFIG"):
        url = daemon_url()
    url = url or own.get("url") or listen_url(DEFAULT_LISTEN)
    token = token or own.get("token")
    token_file = token_file or own.get("token_file")
    if not token and token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InventoryError(f"token file {token_file}: {exc.strerror}") from None
    return str(url).rstrip("/").removesuffix(API), token or None


def daemon_url() -> str | None:
    """The API the daemon's config names (``provisioner.cli.client.default_url``, in the
    standard library); None when there is neither that file nor PROVISIONER_API__LISTEN."""
    named = os.environ.get("PROVISIONER_CONFIG")
    path = Path(named) if named else DAEMON_CONFIG
    listen = os.environ.get("PROVISIONER_API__LISTEN")
    if listen is None:
        try:
            with path.open("rb") as fh:
                api = tomllib.load(fh).get("api")
        except FileNotFoundError:
            if named:
                raise InventoryError(f"{path} does not exist") from None
            return None
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InventoryError(f"{path}: {exc}") from None
        listen = api.get("listen") if isinstance(api, dict) else None
    return listen_url(str(listen or DEFAULT_LISTEN))


def listen_url(listen: str) -> str:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise InventoryError(f"api.listen: expected HOST:PORT, got {listen!r}")
    host = host.removeprefix("[").removesuffix("]")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _config_file() -> dict[str, Any]:
    named = os.environ.get("PROVISIONER_INVENTORY_CONFIG")
    candidates = [Path(named)] if named else [
        Path.home() / ".config" / "provisioner" / "inventory.toml",
        Path("/etc/provisioner/inventory.toml")]
    for path in candidates:
        try:
            with path.open("rb") as fh:
                return tomllib.load(fh)
        except FileNotFoundError:
            if named:
                raise InventoryError(f"{path} does not exist") from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InventoryError(f"{path}: {exc}") from None
    return {}


def get(base: str, token: str | None, path: str, **params: object) -> Any:
    query = "?" + urllib.parse.urlencode(params) if params else ""
    headers = {"Accept": "application/json", "User-Agent": "provisioner-inventory"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base + API + path + query, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        with exc:
            detail = _problem_detail(exc.read()) or exc.reason
        raise InventoryError(f"GET {path}: HTTP {exc.code}: {detail}", exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InventoryError(f"cannot read {base}{API}{path}: {exc}") from None


def _problem_detail(body: bytes) -> str:
    try:
        problem = json.loads(body)
    except ValueError:
        return ""
    return str(problem.get("detail") or problem.get("title") or "") if isinstance(
        problem, dict) else ""


def fetch_nodes(base: str, token: str | None, query: str | None = None) -> list[dict[str, Any]]:
    """Every node (matching ``query``) with its facts: one request per page. A daemon that
    predates ``include=facts`` refuses it (422, an unknown parameter) or leaves the facts
    out; then one detail call per node, a few at a time."""
    nodes: list[dict[str, Any]] = []
    size = os.environ.get("PROVISIONER_INVENTORY_PAGE", "")
    params: dict[str, object] = {"limit": int(size) if size.isdigit() and int(size) > 0
                                 else PAGE, "include": INCLUDE} | (
        {"q": query} if query else {})
    while True:
        try:
            page = get(base, token, "/nodes", **params, offset=len(nodes))
        except InventoryError as exc:
            if exc.status != 422 or "include" not in params or nodes:
                raise
            del params["include"]  # an older daemon
            continue
        nodes += page["items"]
        if not page["items"] or len(nodes) >= page["total"]:
            break
    if all("facts" in node for node in nodes):
        return nodes
    with ThreadPoolExecutor(DETAIL_THREADS) as pool:
        return list(pool.map(lambda node: node if "facts" in node else get(
            base, token, f"/nodes/{node['id']}"), nodes))


def slug(text: str) -> str:
    return _UNSAFE.sub("_", text.lower()).strip("_") or "none"


def gpu_model(facts: dict[str, Any]) -> tuple[str | None, int]:
    """(model, count): the most common GPU name in the facts, from the last inspection or the
    agent's last report. A GPU without a name, or with the pre-table ``NVIDIA 0x2330``, is
    named from the device ID table (``NVIDIA H100 80GB HBM3``); ``vendor:device`` when the
    vendor is not NVIDIA."""
    gpus = facts.get("gpus")
    if not isinstance(gpus, list):
        report = facts.get("last_report")
        gpus = report.get("gpus") if isinstance(report, dict) else None
    if not isinstance(gpus, list) or not gpus:
        return None, 0
    names = [gpu_name(g) for g in gpus if isinstance(g, dict)]
    return (max(set(names), key=names.count) if names else None), len(gpus)


def gpu_name(gpu: dict[str, Any]) -> str:
    name = str(gpu.get("name") or "")
    vendor, device = str(gpu.get("vendor", "")), str(gpu.get("device", ""))
    if vendor.lower() not in ("0x10de", "10de") or device_id(device) is None:
        return name or f"{vendor}:{device}"
    if not name or name.lower() in (f"nvidia {device.lower()}", "nvidia 0x0000"):
        return model_name(device)
    return name


def hostvars(node: dict[str, Any]) -> dict[str, Any]:
    facts = node.get("facts") or {}
    model, count = gpu_model(facts)
    bmc = node.get("bmc") or {}
    values: dict[str, Any] = {
        "provisioner_node_id": node["id"], "provisioner_serial": node.get("serial"),
        "provisioner_state": node.get("state"), "provisioner_rack": node.get("rack"),
        "provisioner_position": node.get("position"),
        "provisioner_profile": node.get("profile"),
        "provisioner_maintenance": bool(node.get("maintenance")),
        "provisioner_macs": list(node.get("macs") or []),
        "provisioner_bmc_driver": bmc.get("driver"), "provisioner_bmc_address": bmc.get("address"),
        "provisioner_gpu_model": model, "provisioner_gpu_count": count,
    }
    address = facts.get("address")
    if isinstance(address, str) and address:
        values["ansible_host"] = address
    return values


def unsafe(value: Any) -> Any:
    """``value`` with every string in it marked as Ansible's unsafe (never templated)."""
    if isinstance(value, str):
        return {"__ansible_unsafe": value}
    if isinstance(value, list):
        return [unsafe(item) for item in value]
    if isinstance(value, dict):
        return {key: unsafe(item) for key, item in value.items()}
    return value


def groups_of(node: dict[str, Any], model: str | None) -> list[str]:
    groups = [f"state_{slug(str(node.get('state')))}"]
    for key in ("rack", "profile"):
        if node.get(key):
            groups.append(f"{key}_{slug(str(node[key]))}")
    if model:
        groups.append(f"gpu_{slug(model)}")
    if node.get("maintenance"):
        groups.append("maintenance")
    return groups


def build(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    inventory: dict[str, Any] = {"_meta": {"hostvars": {}}}
    for node in sorted(nodes, key=lambda n: str(n.get("hostname") or n["id"])):
        name = str(node.get("hostname") or node["id"])
        values = hostvars(node)
        inventory["_meta"]["hostvars"][name] = unsafe(values)
        for group in groups_of(node, values["provisioner_gpu_model"]):
            inventory.setdefault(group, {"hosts": []})["hosts"].append(name)
    inventory["all"] = {"children": sorted(key for key in inventory if key != "_meta")}
    return inventory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Ansible inventory from provisioner")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="all groups and hosts")
    action.add_argument("--host", help="one host's variables")
    args = parser.parse_args(argv)
    try:
        base, token = settings()
        inventory = build(fetch_nodes(base, token, args.host))
    except InventoryError as exc:
        print(f"provisioner inventory: error: {exc}", file=sys.stderr)
        return 1
    if args.host is not None:
        json.dump(inventory["_meta"]["hostvars"].get(args.host, {}), sys.stdout, indent=1)
    else:
        json.dump(inventory, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
