"""The installed OS's "I am up" callback, handed to the deploy step that waits for it.

The booted OS (cloud-init's ``runcmd`` from the seed, or an installer template's last step)
POSTs ``{"event": "booted" | "installed", "hostname": "..."}`` to ``/agent/v1/callback`` with
the node's agent token. Either event ends the wait. A callback that arrives before the step
waits (a fast boot, a daemon restart) is kept until the step asks for it; the step drops
stale ones before it reboots the node (``forget``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from provisioner.domain import Node
from provisioner.errors import FatalError, InvalidRequest
from provisioner.lifecycle.routing import is_simulated

EVENTS: Final = frozenset({"booted", "installed"})
_MAX_PENDING = 10_000
_MAX_HOSTNAME = 253


@dataclass(frozen=True, slots=True)
class Callback:
    event: str
    hostname: str

    @classmethod
    def parse(cls, body: dict[str, object]) -> Callback:
        """The callback's JSON body; InvalidRequest with the reason when it is not one."""
        event, hostname = body.get("event"), body.get("hostname", "")
        if event not in EVENTS:
            raise InvalidRequest(f"event: must be one of {', '.join(sorted(EVENTS))}")
        if not isinstance(hostname, str) or len(hostname) > _MAX_HOSTNAME:
            raise InvalidRequest(f"hostname: must be a string of at most {_MAX_HOSTNAME} "
                                 "characters")
        return cls(str(event), hostname)


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
