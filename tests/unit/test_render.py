"""The iPXE templates: each renders to a script iPXE recognises (``#!ipxe`` alone on line 1)."""

from __future__ import annotations

import pytest
from jinja2 import UndefinedError

from provisioner.boot.render import Renderer

VALUES = {"purpose": "inspect", "node_id": "n1", "mac": "52:54:00:00:00:01",
          "base_url": "http://10.0.0.1:8080", "kernel": "inspect/vmlinuz",
          "initrd": "inspect/initrd.gz", "kernel_args": "console=ttyS0", "token": "pvt_x",
          "reason": "node is active", "seconds": 10}


@pytest.mark.parametrize("name", ["agent", "boot", "local", "retry"])
def test_every_template_is_an_ipxe_script(name: str) -> None:
    text = Renderer().render(name, **VALUES)
    assert text.splitlines()[0] == "#!ipxe"
    assert "{" not in text.replace("${net0/mac}", "")


def test_agent_script_boots_the_ramdisk_with_the_token() -> None:
    lines = Renderer().render("agent", **VALUES).splitlines()
    assert lines[2] == ("kernel http://10.0.0.1:8080/artefacts/inspect/vmlinuz initrd=initrd.gz "
                        "console=ttyS0 provisioner.url=http://10.0.0.1:8080 "
                        "provisioner.token=pvt_x provisioner.mac=52:54:00:00:00:01")
    assert lines[3] == "initrd --name initrd.gz http://10.0.0.1:8080/artefacts/inspect/initrd.gz"
    assert lines[4] == "boot"


def test_a_missing_value_fails_loudly() -> None:
    with pytest.raises(UndefinedError):
        Renderer().render("agent", purpose="inspect")
