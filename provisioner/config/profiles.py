"""The registry of profiles: every profile name the configuration defines, and where.

A *profile* is the name a node carries (``profile`` of an import row or an enrolment) that
picks what the daemon does with it: the image or installer written to its disk
(``[images.<profile>]``, ``[installers.<profile>]``), what it must show before it goes to
Slurm (``[validation.profiles.<profile>]``), its Kubernetes labels (``[kube.profiles.<profile>]``),
its BMC policy (``[bmc.profiles.<profile>]``), its Slurm nodeset and GRES type
(``[slurm.nodesets]``, ``[slurm.gres_types]``), its Ansible variables
(``[install.profile_vars.<profile>]``) and its runbooks, firmware and BIOS baselines and
erase policy (``[servicing.profiles.<profile>]``). A name none of them defines is a typo: the API
refuses it, so that validation is never silently skipped. A configuration that defines no
profile at all (a lab, the tests) has an empty registry and refuses nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from provisioner.config.settings import Settings
from provisioner.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class ProfileRegistry:
    sections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """profile name -> the configuration sections that define it"""

    def check(self, name: str | None) -> None:
        """InvalidRequest (422) naming the known profiles when ``name`` is not one."""
        if name is None or not self.sections or name in self.sections:
            return
        raise InvalidRequest(f"unknown profile {name!r}; known profiles: "
                             f"{', '.join(sorted(self.sections))} (GET /api/v1/profiles)")


def profile_registry(settings: Settings) -> ProfileRegistry:
    found: dict[str, list[str]] = {}
    sources: tuple[tuple[str, Mapping[str, object]], ...] = (
        ("images", settings.images),
        ("installers", settings.installers),
        ("validation.profiles", settings.validation.profiles),
        ("kube.profiles", settings.kube.profiles),
        ("bmc.profiles", settings.bmc.profiles),
        ("slurm.nodesets", settings.slurm.nodesets),
        ("slurm.gres_types", settings.slurm.gres_types),
        ("install.profile_vars", settings.install.profile_vars),
        ("servicing.profiles", settings.servicing.profiles),
    )
    for section, names in sources:
        for name in names:
            found.setdefault(name, []).append(section)
    if settings.simulation.nodes and found:
        found.setdefault(settings.simulation.profile, []).append("simulation.profile")
    return ProfileRegistry({name: tuple(where) for name, where in sorted(found.items())})
