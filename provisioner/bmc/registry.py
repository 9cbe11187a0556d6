"""BMC drivers by name. ``daemon.py`` fills it; steps only see ``BmcFactory``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from provisioner.bmc.base import Bmc, BmcFactory
from provisioner.domain import BmcCredentials, BmcEndpoint
from provisioner.errors import FatalError


class BmcRegistry:
    def __init__(self, drivers: Mapping[str, BmcFactory], *,
                 closers: Sequence[Callable[[], Awaitable[None]]] = ()) -> None:
        """``closers``: the drivers' ``aclose`` (logout of kept sessions), run by ``aclose``."""
        self._drivers = dict(drivers)
        self._closers = list(closers)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._drivers)

    def driver(self, name: str) -> BmcFactory | None:
        return self._drivers.get(name)

    def __call__(self, node_id: str, endpoint: BmcEndpoint, credentials: BmcCredentials) -> Bmc:
        factory = self._drivers.get(endpoint.driver)
        if factory is None:
            available = ", ".join(sorted(self._drivers)) or "none"
            raise FatalError(f"BMC driver {endpoint.driver!r} is not available "
                             f"(available: {available})")
        return factory(node_id, endpoint, credentials)

    async def aclose(self) -> None:
        for close in self._closers:
            await close()
