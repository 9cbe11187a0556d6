"""The REST API under ``/api/v1`` (aiohttp); ``provisioner.api.app.make_app`` builds it.

The typed keys live here, not in ``app.py``: ``app.py`` stores them and imports the handler
modules, which read them, so keeping them in ``app.py`` would make an import cycle.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from provisioner.api.events import EventFeed, EventHub
from provisioner.api.ui.session import SessionStore
from provisioner.config import ApiSettings
from provisioner.config.profiles import ProfileRegistry
from provisioner.domain import TokenInfo
from provisioner.kube.joiner import KubeNodeJoiner
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.repair import RepairService
from provisioner.lifecycle.rotation import BmcRotation
from provisioner.lifecycle.waves import WaveDriver
from provisioner.metrics import Metrics
from provisioner.slurm.model import SlurmClient
from provisioner.store.ownership import OwnershipRepo
from provisioner.store.repo import NodeRepo
from provisioner.store.tokens import TokenRepo
from provisioner.topology_live.live import LiveTopology

CONDUCTOR: Final = web.AppKey("conductor", Conductor)
NODES: Final = web.AppKey("nodes", NodeRepo)
TOKENS: Final = web.AppKey("tokens", TokenRepo)
METRICS: Final = web.AppKey("metrics", Metrics)
SETTINGS: Final = web.AppKey("settings", ApiSettings)
TOPOLOGY: Final = web.AppKey("topology", LiveTopology)
EVENTS: Final = web.AppKey("events", EventHub)
FEED: Final = web.AppKey("feed", EventFeed)
SESSIONS: Final = web.AppKey("sessions", SessionStore)
ROTATION: Final = web.AppKey("rotation", BmcRotation)
OWNERSHIP: Final = web.AppKey("ownership", OwnershipRepo)
REPAIRS: Final = web.AppKey("repairs", RepairService)
ACCEPTANCE: Final = web.AppKey("acceptance", DomainAcceptance)
HEALTH: Final = web.AppKey("health", HealthFindings)
PROFILES: Final = web.AppKey("profiles", ProfileRegistry)
#: where power-off asks whether a node runs jobs (absent: no Slurm, nothing to ask)
SLURM: Final = web.AppKey("slurm", SlurmClient)
#: where ``GET /nodes/{id}/why`` reads the node's Node and its labels (absent: no Kubernetes)
KUBE: Final = web.AppKey("kube", KubeNodeJoiner)
#: firmware waves (absent: a daemon without them answers 400)
WAVES: Final = web.AppKey("waves", WaveDriver)
#: the caller's token, set by the auth middleware on every authenticated request
PRINCIPAL: Final = web.RequestKey("principal", TokenInfo)


def actor(request: web.Request) -> str:
    """Who the history records for this request: ``token:<name>``."""
    return f"token:{request[PRINCIPAL].name}"
