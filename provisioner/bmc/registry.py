"""BMC drivers by name. ``daemon.py`` fills it; steps only see ``BmcFactory``."""

from __future__ import annotations

from collections.abc import Mapping

from provisioner.bmc.base import Bmc, BmcFactory
from provisioner.domain import BmcCredentials, BmcEndpoint
from provisioner.errors import FatalError


class BmcRegistry:
    def __init__(self, drivers: Mapping[str, BmcFactory]) -> None:
        self._drivers = dict(drivers)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._drivers)

    def __call__(self, node_id: str, endpoint: BmcEndpoint, credentials: BmcCredentials) -> Bmc:
        factory = self._drivers.get(endpoint.driver)
        if factory is None:
            available = ", ".join(sorted(self._drivers)) or "none"
            raise FatalError(f"BMC driver {endpoint.driver!r} is not available "
                             f"(available: {available})")
        return factory(node_id, endpoint, credentials)
