"""The cloud-init NoCloud seed of one deployment: an ISO9660 volume labelled ``cidata``.

The agent writes it to a small partition at the end of the node's disk; cloud-init in the
deployed OS finds it by its label and applies the hostname, the SSH keys and the network
configuration of the provisioning NIC, then its ``runcmd`` tells the daemon the OS is up
(``POST /agent/v1/callback``, ``{"event": "booted", ...}``, with the node's agent token).
``provisioner.env`` repeats the callback for images without cloud-init (a shell can source
it). Documents are written as JSON, which YAML readers accept, so no value needs escaping
rules of its own. The only module that imports pycdlib.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import pycdlib

LABEL = "cidata"
CALLBACK_PATH = "/agent/v1/callback"


@dataclass(frozen=True, slots=True)
class SeedSpec:
    instance_id: str  # new per deployment, so cloud-init runs again on a redeployed disk
    hostname: str
    mac: str | None  # the provisioning NIC; None: DHCP on every NIC is left to the image
    ssh_authorized_keys: tuple[str, ...]
    callback_url: str
    token: str


def documents(spec: SeedSpec) -> dict[str, bytes]:
    """The seed's files by name."""
    meta = {"instance-id": spec.instance_id, "local-hostname": spec.hostname}
    user: dict[str, object] = {
        "hostname": spec.hostname.split(".")[0], "preserve_hostname": False,
        "runcmd": [["sh", "-c", _callback_script(spec)]]}
    if "." in spec.hostname:
        user["fqdn"] = spec.hostname
    if spec.ssh_authorized_keys:
        user["ssh_authorized_keys"] = list(spec.ssh_authorized_keys)
    files = {"meta-data": json.dumps(meta, indent=1) + "\n",
             "user-data": "#cloud-config\n" + json.dumps(user, indent=1) + "\n",
             "provisioner.env": "".join(f"{key}={_sh(value)}\n" for key, value in (
                 ("PROVISIONER_CALLBACK_URL", spec.callback_url),
                 ("PROVISIONER_TOKEN", spec.token), ("PROVISIONER_HOSTNAME", spec.hostname)))}
    if spec.mac is not None:
        network = {"version": 2, "ethernets": {"provisioning": {
            "match": {"macaddress": spec.mac}, "dhcp4": True}}}
        files["network-config"] = json.dumps(network, indent=1) + "\n"
    return {name: text.encode() for name, text in files.items()}


def build_seed(spec: SeedSpec) -> bytes:
    """The ISO9660 image (Rock Ridge and Joliet names, as ``genisoimage -J -R`` makes)."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=LABEL)
    for index, (name, data) in enumerate(sorted(documents(spec).items())):
        iso.add_fp(io.BytesIO(data), len(data), f"/F{index}.;1", rr_name=name,
                   joliet_path=f"/{name}")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


#: the OS's host public keys (cloud-init generated them before ``runcmd``), as JSON strings
#: "<type> <base64>" joined by commas
_HOST_KEYS = (r"""keys=$(cat /etc/ssh/ssh_host_*_key.pub 2>/dev/null | awk """
              r"""'NF >= 2 {printf "%s\"%s %s\"", (n++ ? "," : ""), $1, $2}'); """)


def _callback_script(spec: SeedSpec) -> str:
    """POST ``booted`` with the hostname the OS ended up with and its SSH host public keys
    (the only ones Ansible then accepts from it, ``install/known_hosts.py``); retried for
    ten minutes (the daemon may be restarting). curl, else wget."""
    auth, url = _sh(f"Authorization: Bearer {spec.token}"), _sh(spec.callback_url)
    return (
        _HOST_KEYS
        + 'body="{\\"event\\": \\"booted\\", \\"hostname\\": \\"$(hostname)\\", '
        '\\"host_keys\\": [$keys]}"; '
        "for i in $(seq 60); do "
        f"curl -fsS -m 30 -X POST -H {auth} -H 'Content-Type: application/json' "
        f'--data "$body" {url} && exit 0; '
        f"wget -q -O /dev/null --header={auth} --header='Content-Type: application/json' "
        f'--post-data="$body" {url} && exit 0; '
        "sleep 10; done; exit 1")


def _sh(value: str) -> str:
    """One shell word, single-quoted."""
    return "'" + value.replace("'", "'\\''") + "'"
