"""``SlurmClient`` over the ``scontrol`` command (asyncio subprocesses, never a shell).

For sites without slurmrestd, and for the writes slurmrestd v0.0.38 (Slurm 22.05) cannot do:
drain, resume and delete of a node. ``scontrol --json`` does not exist in 22.05, so reads
parse the one-line form (``show node -o``). stderr is mapped onto the error tree: an
unreachable controller is retryable, a refused user is fatal.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from provisioner.commands import run_command
from provisioner.errors import DriverError
from provisioner.slurm.model import (
    SlurmAuthFailed,
    SlurmNode,
    SlurmRejected,
    SlurmUnavailable,
)
from provisioner.slurm.parse import node_from_scontrol
from provisioner.slurm.reservation import Reservation, reservation_from_scontrol

log = logging.getLogger(__name__)
_NOT_FOUND = ("not found", "invalid node name")
_UNREACHABLE = ("unable to contact slurm controller", "connection refused", "timed out",
                "communication connection failure", "socket timed out")
_REFUSED = ("access/permission denied", "invalid user", "permission denied",
            "authentication")


class ScontrolSlurm:
    def __init__(self, *, scontrol: str = "scontrol", slurm_conf: Path | None = None,
                 timeout_s: float = 30.0, env: Mapping[str, str] | None = None) -> None:
        self._scontrol = scontrol
        self._timeout_s = timeout_s
        self._env = dict(os.environ if env is None else env)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = str(slurm_conf)
        self._parsed: dict[str, SlurmNode] = {}  # the last listing's lines, parsed

    async def nodes(self) -> list[SlurmNode]:
        """Every node (``show node -o``). A line the last listing held too is not parsed
        again: at rest most of a fleet's lines do not change between two sync passes."""
        out = await self._run(["show", "node", "-o"])
        known, parsed = self._parsed, {}
        for line in out.splitlines():
            if (line := line.strip()).startswith("NodeName="):
                parsed[line] = known.get(line) or node_from_scontrol(line)
        self._parsed = parsed
        return list(parsed.values())

    async def node(self, name: str) -> SlurmNode | None:
        try:
            out = await self._run(["show", "node", "-o", name])
        except SlurmRejected as exc:
            if any(needle in str(exc).lower() for needle in _NOT_FOUND):
                return None
            raise
        found = [node_from_scontrol(line) for line in out.splitlines()
                 if line.startswith("NodeName=")]
        return next((n for n in found if n.name == name), None)

    async def drain(self, name: str, reason: str) -> None:
        await self._run(["update", f"nodename={name}", "state=drain", f"reason={reason}"])

    async def resume(self, name: str) -> None:
        current = await self.node(name)
        if current is None or not current.draining and current.state != "DOWN":
            return  # resuming an undrained node is an error in Slurm; idempotent here
        await self._run(["update", f"nodename={name}", "state=resume"])

    async def delete(self, name: str) -> bool:
        if await self.node(name) is None:
            return False
        await self._run(["delete", f"nodename={name}"])
        return True

    async def create_reservation(self, name: str, nodes: Sequence[str], users: str) -> None:
        await self._run(["create", "reservation", f"reservationname={name}",
                         f"nodes={','.join(nodes)}", "starttime=now", "duration=infinite",
                         f"users={users}", "flags=maint,ignore_jobs"])

    async def update_reservation(self, name: str, nodes: Sequence[str]) -> None:
        await self._run(["update", f"reservationname={name}", f"nodes={','.join(nodes)}"])

    async def reservation(self, name: str) -> Reservation | None:
        try:
            out = await self._run(["show", "reservation", "-o", name])
        except SlurmRejected as exc:
            if "not found" in str(exc).lower():
                return None
            raise
        return reservation_from_scontrol(out)

    async def delete_reservation(self, name: str) -> bool:
        if await self.reservation(name) is None:
            return False
        await self._run(["delete", f"reservationname={name}"])
        return True

    async def aclose(self) -> None:
        return None

    async def _run(self, args: Sequence[str]) -> str:
        what = "scontrol " + " ".join(args[:3])
        try:
            result = await run_command([self._scontrol, *args], timeout_s=self._timeout_s,
                                       env=self._env)
        except OSError as exc:
            raise SlurmRejected(f"{what}: cannot run {self._scontrol}: {exc.strerror}") from exc
        except TimeoutError:
            raise SlurmUnavailable(f"{what}: no answer after {self._timeout_s:g} s") from None
        if result.returncode != 0:
            raise _error(what, result.stderr.strip() or result.stdout.strip())
        return result.stdout


def _error(what: str, detail: str) -> DriverError:
    text = detail.lower()
    message = f"{what}: {detail or 'failed'}"
    if any(needle in text for needle in _UNREACHABLE):
        return SlurmUnavailable(message)
    if any(needle in text for needle in _REFUSED):
        return SlurmAuthFailed(message)
    return SlurmRejected(message)
