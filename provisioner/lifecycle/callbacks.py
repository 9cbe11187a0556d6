"""The installed OS's "I am up" callback, handed to the deploy step that waits for it.

The booted OS (cloud-init's ``runcmd`` from the seed, or an installer template's last step)
POSTs ``{"event": "booted" | "installed", "hostname": "...", "host_keys": ["ssh-ed25519
AAAA...", ...]}`` to ``/agent/v1/callback`` with the node's agent token. Either event ends the
wait. ``host_keys`` (optional) are the OS's SSH host public keys: delivered over the token's
address-bound channel while the deploy step waits, they become the only keys Ansible accepts
from the node (``install/known_hosts.py``). A callback that arrives before the step
waits (a fast boot, a daemon restart) is kept until the step asks for it; the step drops
stale ones before it reboots the node (``forget``).
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from provisioner.domain import Node
from provisioner.errors import FatalError, InvalidRequest
from provisioner.lifecycle.routing import is_simulated

EVENTS: Final = frozenset({"booted", "installed"})
_MAX_PENDING = 10_000
_MAX_HOSTNAME = 253
_MAX_HOST_KEYS = 8
#: an OpenSSH public key line: type and base64 blob (a comment, if any, is dropped)
_HOST_KEY = re.compile(r"(ssh-ed25519|ecdsa-sha2-nistp(?:256|384|521)|ssh-rsa) "
                       r"([A-Za-z0-9+/]{20,8192}={0,2})(?: [\x21-\x7e]{0,255})?")


@dataclass(frozen=True, slots=True)
class Callback:
    event: str
    hostname: str
    host_keys: tuple[str, ...] = ()  # "<type> <base64>", comments dropped
    address: str | None = None  # an address the body claims (never trusted: compared)

    @classmethod
    def parse(cls, body: dict[str, object]) -> Callback:
        """The callback's JSON body; InvalidRequest with the reason when it is not one."""
        event, hostname = body.get("event"), body.get("hostname", "")
        if event not in EVENTS:
            raise InvalidRequest(f"event: must be one of {', '.join(sorted(EVENTS))}")
        if not isinstance(hostname, str) or len(hostname) > _MAX_HOSTNAME:
            raise InvalidRequest(f"hostname: must be a string of at most {_MAX_HOSTNAME} "
                                 "characters")
        address = body.get("address")
        if address is not None and (not isinstance(address, str) or len(address) > 64):
            raise InvalidRequest("address: must be a string of at most 64 characters")
        return cls(str(event), hostname, _host_keys(body.get("host_keys", [])), address)


def _host_keys(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list) or len(raw) > _MAX_HOST_KEYS:
        raise InvalidRequest(f"host_keys: must be a list of at most {_MAX_HOST_KEYS} SSH "
                             "public keys")
    keys = []
    for line in raw:
        match = _HOST_KEY.fullmatch(line.strip()) if isinstance(line, str) else None
        if match is None:
            raise InvalidRequest("host_keys: each must be an OpenSSH public key line "
                                 "(ssh-ed25519, ecdsa-sha2-nistp*, ssh-rsa)")
        keys.append(f"{match[1]} {match[2]}")
    return tuple(dict.fromkeys(keys))


class BootCallbacks:
    """A ``BootWaiter``: the deploy step's wait for a node's OS to call back."""

    def __init__(self, *, timeout_s: float, installer_profiles: frozenset[str] = frozenset()
                 ) -> None:
        self._timeout_s = timeout_s
        self._installer_profiles = installer_profiles
        self._waiting: dict[str, asyncio.Future[Callback]] = {}
        self._pending: OrderedDict[str, Callback] = OrderedDict()

    def uses_installer(self, node: Node) -> bool:
        return node.profile is not None and node.profile in self._installer_profiles

    def deliver(self, node_id: str, callback: Callback) -> bool:
        """Hand a callback to the waiting step; True when one was waiting."""
        future = self._waiting.get(node_id)
        if future is not None and not future.done():
            future.set_result(callback)
            return True
        self._pending[node_id] = callback
        self._pending.move_to_end(node_id)
        while len(self._pending) > _MAX_PENDING:
            self._pending.popitem(last=False)
        return False

    def waits(self, node: Node) -> bool:
        return not is_simulated(node) and self._timeout_s > 0

    async def forget(self, node: Node) -> None:
        """Drop a callback from an earlier boot (called before the node is rebooted)."""
        self._pending.pop(node.id, None)

    async def wait_booted(self, node: Node) -> None:
        """Wait for the callback; FatalError after the timeout, or when the OS reports
        another hostname than the node's (the seed was not applied)."""
        if not self.waits(node):
            return
        callback = self._pending.pop(node.id, None)
        if callback is None:
            future: asyncio.Future[Callback] = asyncio.get_running_loop().create_future()
            self._waiting[node.id] = future
            try:
                async with asyncio.timeout(self._timeout_s):
                    callback = await future
            except TimeoutError:
                raise FatalError(f"the deployed OS did not call back within "
                                 f"{self._timeout_s:g} s (deploy.callback_timeout_s): it "
                                 "did not boot from disk, or has no cloud-init") from None
            finally:
                if self._waiting.get(node.id) is future:
                    del self._waiting[node.id]
        expected = (node.hostname or "").split(".")[0]
        if expected and callback.hostname.split(".")[0] != expected:
            raise FatalError(f"the deployed OS reported hostname {callback.hostname!r}, not "
                             f"{node.hostname!r}: the cloud-init seed was not applied")
