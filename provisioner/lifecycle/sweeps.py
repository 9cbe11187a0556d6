"""Fleet-wide expiry sweeps (docs/ha.md, "Singletons").

Run by the one daemon leading the ``fleet`` singleton, so several daemons on one database do
not each scan the same rows: lapsed DHCP leases are marked expired and declined addresses
whose hold is over are freed (the shared ``lease`` table), and expired API and agent tokens
are deleted (``api_token``). Neither sweep is needed for correctness (an expired token is
refused and a lapsed lease is reclaimed whether swept or not); they keep the tables small
and the lease states true. ``HistoryRetention`` prunes history rows older than
``store.history_retention_days`` (never a node's last row), hourly. Caches (the MAC cache,
the negative discovery cache) are each daemon's own and expire in it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from provisioner.lifecycle.periodic import every
from provisioner.store.leases import LeaseRepo
from provisioner.store.node_reads import NodeReads
from provisioner.store.tokens import TokenRepo

PRUNE_INTERVAL_S: Final = 3600.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Swept:
    leases: int  # lease rows marked expired or freed
    tokens: int  # expired tokens deleted

    def __bool__(self) -> bool:
        return bool(self.leases or self.tokens)


class ExpirySweeps:
    def __init__(self, leases: LeaseRepo, tokens: TokenRepo, *, interval_s: float,
                 instance: str) -> None:
        self._leases = leases
        self._tokens = tokens
        self.interval_s = interval_s
        self._instance = instance

    async def sweep(self) -> Swept:
        swept = Swept(leases=await self._leases.expire(),
                      tokens=await self._tokens.delete_expired())
        if swept:
            log.info("expiry sweep by %s: %d DHCP leases expired or freed, %d expired tokens "
                     "deleted", self._instance, swept.leases, swept.tokens)
        return swept

    async def run(self) -> None:
        """Sweep every ``interval_s`` while this daemon leads (cancelled when it stops)."""
        await every(self.interval_s, self.sweep, "expiry sweep")


class HistoryRetention:
    def __init__(self, repo: NodeReads, *, days: int, interval_s: float = PRUNE_INTERVAL_S,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._repo = repo
        self.days = days
        self.interval_s = interval_s
        self._clock = clock

    async def prune(self) -> int:
        """Delete the rows older than ``days`` (0: none); how many went."""
        if self.days <= 0:
            return 0
        gone = await self._repo.prune_history(self._clock() - timedelta(days=self.days))
        if gone:
            log.info("history retention: %d rows older than %d days pruned", gone, self.days)
        return gone

    async def run(self) -> None:
        """Prune every ``interval_s`` while this daemon leads (cancelled when it stops)."""
        await every(self.interval_s, self.prune, "history pruning")
