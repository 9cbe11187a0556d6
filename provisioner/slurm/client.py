"""The ``SlurmClient`` a configuration asks for: slurmrestd when ``slurm.restd_url`` is set
(scontrol behind it for the writes its API version lacks), else scontrol alone."""

from __future__ import annotations

from provisioner.config import SlurmSettings
from provisioner.slurm.model import SlurmClient
from provisioner.slurm.reservation import SlurmMaintenance
from provisioner.slurm.rest import RestSlurm
from provisioner.slurm.scontrol import ScontrolSlurm


def make_slurm_client(settings: SlurmSettings) -> SlurmClient:
    scontrol = ScontrolSlurm(scontrol=settings.scontrol, slurm_conf=settings.slurm_conf,
                             timeout_s=settings.request_timeout_s)
    if settings.restd_url is None:
        return scontrol
    return RestSlurm(settings.restd_url, user=settings.user, token=settings.jwt_token,
                     token_file=settings.jwt_token_file, timeout_s=settings.request_timeout_s,
                     writer=scontrol)


def make_maintenance(settings: SlurmSettings, client: SlurmClient) -> SlurmMaintenance:
    """Maintenance reservations (fabric acceptance of an active domain): written with
    scontrol, the nodes' states read through ``client``."""
    writer = ScontrolSlurm(scontrol=settings.scontrol, slurm_conf=settings.slurm_conf,
                           timeout_s=settings.request_timeout_s)
    return SlurmMaintenance(client, writer)  # users=root: the tests run over SSH, not as jobs
