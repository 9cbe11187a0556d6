"""The RA responder against a real IPv6 stack's client: ndisc6's ``rdisc6`` sends a Router
Solicitation from one end of a veth pair in a namespace the test made; our responder (run in
that namespace) answers on the other end, and rdisc6 prints the advertisement."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from provisioner.boot.ra import ICMPV6_RA, router_advertisement
from tests.peers.netns import Namespace, netns_unavailable_reason, plain_namespace

pytestmark = pytest.mark.root

RESPONDER = """
import asyncio, sys
from provisioner.boot.ra import RouterAdvertiser
async def main():
    ra = RouterAdvertiser("srv0")
    await ra.start()
    print("ready", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


def test_router_advertisement_bytes() -> None:
    packet = router_advertisement(bytes.fromhex("020000000001"))
    assert packet[0] == ICMPV6_RA and packet[4] == 64  # cur hop limit
    assert packet[5] == 0 and packet[6:8] == b"\0\0"  # no M/O flags, router lifetime 0
    assert packet[16:24] == bytes.fromhex("0101020000000001")  # source link-layer option


@pytest.fixture
def veth_ns() -> Iterator[Namespace]:
    reason = netns_unavailable_reason() or (
        None if shutil.which("rdisc6") else "rdisc6 (Debian ndisc6) is not installed")
    if reason:
        pytest.skip(reason)
    with plain_namespace() as ns:
        run = ns.exec_prefix()
        subprocess.run([*run, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0",
                        "net.ipv6.conf.default.accept_dad=0"], check=True)
        subprocess.run([*run, "ip", "link", "add", "srv0", "type", "veth", "peer", "cli0"],
                       check=True)
        for dev in ("srv0", "cli0"):
            subprocess.run([*run, "ip", "link", "set", dev, "up"], check=True)
        yield ns


def test_rdisc6_gets_our_advertisement(veth_ns: Namespace) -> None:
    responder = subprocess.Popen([*veth_ns.exec_prefix(), sys.executable, "-c", RESPONDER],
                                 stdout=subprocess.PIPE, text=True)
    try:
        assert responder.stdout is not None and responder.stdout.readline() == "ready\n"
        started = time.monotonic()
        result = subprocess.run([*veth_ns.exec_prefix(), "rdisc6", "-1", "-w", "3000",
                                 "cli0"], capture_output=True, text=True, timeout=20)
        elapsed = time.monotonic() - started
    finally:
        responder.terminate()
        responder.wait(10)
    assert result.returncode == 0, result.stdout + result.stderr
    fields = {line.split(":")[0].strip(): line.partition(":")[2].strip()
              for line in result.stdout.splitlines() if ":" in line}
    assert fields["Router lifetime"].startswith("0 "), result.stdout
    assert fields["Stateful address conf."] == "No"
    assert fields["Stateful other conf."] == "No"
    assert elapsed < 2.0  # answered, not timed out
