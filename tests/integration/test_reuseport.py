"""One UDP port, several sockets (``boot/reuseport.py``): every datagram from one source
address reaches the same socket, whatever its source port, the one ``steer_index`` names;
many addresses spread over every socket, also addresses alike in their low bits; with a
socket closed, the group still receives everything. Steered by DHCP ``chaddr`` instead,
every request of one client reaches one socket, whoever relays it, and a rack's MACs
spread. Real sockets on loopback addresses."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from provisioner.boot.dhcp_codec import MessageType, encode
from provisioner.boot.reuseport import chaddr_index, reuseport_group, steer_index
from provisioner.boot.worker_group import shares
from tests.peers.dhcp_client import request_packet

ADDRESSES = [f"127.0.0.{n}" for n in range(10, 40)]


def _send_from_each(port: int, per_address: int) -> None:
    for address in ADDRESSES:
        for _ in range(per_address):  # a new source port each time
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
                client.bind((address, 0))
                client.sendto(b"rrq", ("127.0.0.1", port))


def _received(socks: list[socket.socket]) -> dict[str, set[int]]:
    """Source address -> the indexes of the sockets that received from it."""
    seen: dict[str, set[int]] = {}
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        for index, sock in enumerate(socks):
            while True:
                try:
                    _, (address, _port) = sock.recvfrom(100)
                except BlockingIOError:
                    break
                seen.setdefault(address, set()).add(index)
        if len(seen) == len(ADDRESSES):
            break
        time.sleep(0.01)
    return seen


@pytest.fixture
def group() -> Iterator[list[socket.socket]]:
    socks = reuseport_group("127.0.0.1", 0, 3)
    yield socks
    for sock in socks:
        sock.close()


def test_one_address_reaches_one_socket_and_addresses_spread(group: list[socket.socket]) -> None:
    ports = {sock.getsockname()[1] for sock in group}
    assert len(ports) == 1
    _send_from_each(ports.pop(), per_address=4)
    seen = _received(group)
    assert set(seen) == set(ADDRESSES)
    # the kernel runs the program: each address reaches the socket steer_index names
    assert {a: {steer_index(a, 3)} for a in ADDRESSES} == seen
    assert set().union(*seen.values()) == {0, 1, 2}


def test_addresses_alike_in_their_low_bits_still_spread() -> None:
    """A rack's ``10.0.k.2`` (or every even address) must not all land on one worker."""
    alike = [f"10.0.{k}.2" for k in range(16)]
    assert {steer_index(a, 2) for a in alike} == {0, 1}
    assert {steer_index(f"10.0.0.{2 * n}", 4) for n in range(1, 64)} == {0, 1, 2, 3}


def test_a_smaller_group_still_receives_everything(group: list[socket.socket]) -> None:
    port = group[0].getsockname()[1]
    group[1].close()
    rest = [group[0], group[2]]
    _send_from_each(port, per_address=2)
    assert set(_received(rest)) == set(ADDRESSES)


def test_transfers_are_shared_out_to_the_last_one() -> None:
    assert shares(1000, 3) == [334, 333, 333]
    assert shares(2, 2) == [1, 1]
    assert shares(7, 3) == [3, 2, 2]


def test_dhcp_requests_are_steered_by_their_client_not_their_relay() -> None:
    """One relay address (every request of a routed segment comes from it) and 60 clients
    of one vendor (alike in their first bytes): each client's DISCOVER and REQUEST reach
    the socket ``chaddr_index`` names, and the clients spread over all three; a datagram
    too short to hold a ``chaddr`` still reaches the group."""
    macs = [f"b8:3f:d2:00:{n // 256:02x}:{n % 256:02x}" for n in range(0, 60 * 37, 37)]
    socks = reuseport_group("127.0.0.1", 0, 3, by="chaddr")
    try:
        port = socks[0].getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as relay:
            relay.bind(("127.0.0.7", 0))
            for mac in macs:
                for kind in (MessageType.DISCOVER, MessageType.REQUEST):
                    relay.sendto(encode(request_packet(mac, kind)), ("127.0.0.1", port))
            relay.sendto(b"\x01\x01", ("127.0.0.1", port))
        by_socket: dict[str, set[int]] = {}
        short = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and (
                sum(map(len, by_socket.values())) < len(macs) or not short):
            for index, sock in enumerate(socks):
                while True:
                    try:
                        data = sock.recv(2048)
                    except BlockingIOError:
                        break
                    if len(data) < 34:
                        short += 1
                        continue
                    mac = ":".join(f"{b:02x}" for b in data[28:34])
                    by_socket.setdefault(mac, set()).add(index)
            time.sleep(0.01)
        assert by_socket == {mac: {chaddr_index(encode(request_packet(
            mac, MessageType.DISCOVER)), 3)} for mac in macs}
        assert set().union(*by_socket.values()) == {0, 1, 2}
        assert short == 1
    finally:
        for sock in socks:
            sock.close()
