"""BMC password rotation: a node's BMC gets a per-node generated password (or the site's
``bmc.rotation_password``), set through the driver (IPMI Set User Password, Redfish
AccountService) and verified by a fresh login before the old one is forgotten.

Crash-safe by two phases: the new password is committed (encrypted) as *pending* before
the BMC hears of it, and becomes the node's only after the fresh login worked. Whatever
happens in between (SIGKILL, BMC timeout), ``settle`` later finds out which of the two the
BMC accepts, by fresh logins, and keeps that one; while it cannot tell, it keeps both.
The history says what happened, never a secret.
"""

from __future__ import annotations

import logging
import secrets
import string
from collections.abc import Awaitable, Callable
from typing import Final

from provisioner.bmc.base import BmcAuthFailed, BmcFactory, PasswordSetter
from provisioner.domain import BmcCredentials, Node
from provisioner.errors import DriverError, FatalError, InvalidRequest
from provisioner.store.bmc_secrets import BmcSecretRepo
from provisioner.store.repo import NodeRepo

log = logging.getLogger(__name__)

ROTATED: Final = "bmc_password_rotated"
RECOVERED: Final = "bmc_password_rotation_recovered"
ABANDONED: Final = "bmc_password_rotation_abandoned"
_ALPHABET: Final = string.ascii_letters + string.digits
LENGTH: Final = 16
"""IPMI's Set User Password takes 16 bytes (20 only on IPMI 2.0-only users)."""

PasswordSource = Callable[[Node], str]
Effective = Callable[[BmcCredentials], BmcCredentials]


def generated_password(_node: Node) -> str:
    """16 letters and digits (about 95 bits), with at least one of each kind that BMC
    password rules ask for (lower, upper, digit); no symbols, which some BMCs refuse."""
    while True:
        password = "".join(secrets.choice(_ALPHABET) for _ in range(LENGTH))
        if (any(c.islower() for c in password) and any(c.isupper() for c in password)
                and any(c.isdigit() for c in password)):
            return password


class BmcRotation:
    def __init__(self, nodes: NodeRepo, secrets_: BmcSecretRepo, bmc: BmcFactory, *,
                 passwords: PasswordSource = generated_password,
                 effective: Effective = lambda creds: creds) -> None:
        """``effective``: the credentials the BMC layer really uses (site defaults filled
        in, ``BmcManager.credentials_for``)."""
        self._nodes = nodes
        self._secrets = secrets_
        self._bmc = bmc
        self._passwords = passwords
        self._effective = effective

    async def rotate(self, node: Node, *, actor: str) -> None:
        if node.bmc is None:
            raise InvalidRequest(f"node {node.id} has no BMC endpoint")
        await self.settle(node, actor=actor)  # an earlier rotation a crash interrupted
        old = self._effective(await self._nodes.credentials(node.id))
        if not old.username or not old.password:
            raise InvalidRequest(f"node {node.id}: no BMC credentials to rotate from (set "
                                 "them on the node or bmc.default_username/default_password)")
        await self._with(node, old, lambda bmc: bmc.verify_login())  # we can, before we change
        new = BmcCredentials(old.username, self._passwords(node))
        await self._secrets.begin(node.id, new.password or "")  # before the BMC hears of it
        try:
            await self._with(node, old, lambda bmc: bmc.set_password(new.password or ""))
            await self._with(node, new, lambda bmc: bmc.verify_login())
        except BaseException:
            # did the BMC take it? settle decides by fresh logins (keeps both if it cannot)
            await self._settle_quietly(node, actor)
            raise
        await self._secrets.promote(
            node.id, username=old.username, event=ROTATED, actor=actor,
            reason=f"BMC password of user {old.username!r} rotated; a fresh login with the "
                   "new one worked")
        log.info("node %s: BMC password rotated by %s", node.id, actor)

    async def settle(self, node: Node, *, actor: str) -> str:
        """Close a rotation a crash left open: "none", "promoted" (the BMC has the new
        password) or "abandoned" (it still has the old one). A BMC user has one password,
        so one fresh login that works decides; BmcAuthFailed when both are refused, and
        a BMC that answers neither login decides nothing (its error is raised; both kept)."""
        pending = await self._secrets.pending(node.id)
        if pending is None or node.bmc is None:
            return "none"
        current = self._effective(await self._nodes.credentials(node.id))
        user = current.username or ""
        new_ok = await self._logs_in(node, BmcCredentials(user, pending))
        if new_ok is True:
            await self._secrets.promote(
                node.id, username=user, event=RECOVERED, actor=actor,
                reason="an interrupted BMC password rotation had landed: the new password "
                       "logs in and is kept")
            return "promoted"
        old_ok = await self._logs_in(node, current)
        if old_ok is True:
            await self._secrets.abandon(
                node.id, event=ABANDONED, actor=actor,
                reason="the BMC password was not changed: the old password still logs in "
                       "and is kept")
            return "abandoned"
        for outcome in (old_ok, new_ok):
            if isinstance(outcome, DriverError):
                raise outcome  # could not tell: both kept
        raise BmcAuthFailed(f"node {node.id}: neither the current nor the pending BMC "
                            "password logs in; both are kept")

    async def settle_all(self, *, actor: str) -> dict[str, str]:
        """At start: every rotation a crash left open (failures logged, retried later)."""
        outcome: dict[str, str] = {}
        for node_id in await self._secrets.open_rotations():
            node = await self._nodes.get(node_id)
            try:
                outcome[node_id] = await self.settle(node, actor=actor)
            except Exception as exc:  # one BMC must not stop the others
                log.warning("node %s: interrupted BMC password rotation not settled: %s",
                            node_id, exc)
                outcome[node_id] = "open"
        return outcome

    async def _settle_quietly(self, node: Node, actor: str) -> None:
        try:
            await self.settle(node, actor=actor)
        except Exception as exc:
            log.warning("node %s: BMC password rotation left open: %s", node.id, exc)

    async def _logs_in(self, node: Node, creds: BmcCredentials) -> bool | DriverError:
        """True: a fresh login worked; False: the password was refused; otherwise the
        error that kept us from knowing (timeout, unreachable)."""
        try:
            await self._with(node, creds, lambda bmc: bmc.verify_login())
        except BmcAuthFailed:
            return False
        except DriverError as exc:
            return exc
        return True

    async def _with(self, node: Node, creds: BmcCredentials,
                    fn: Callable[[PasswordSetter], Awaitable[None]]) -> None:
        assert node.bmc is not None
        bmc = self._bmc(node.id, node.bmc, creds)
        try:
            if not isinstance(bmc, PasswordSetter):
                raise FatalError(f"node {node.id}: its BMC driver cannot change passwords")
            await fn(bmc)
        finally:
            await bmc.aclose()
