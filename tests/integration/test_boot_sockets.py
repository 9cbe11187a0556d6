"""DatagramSocket, the boot servers' UDP reader: a burst larger than one wake-up's batch
arrives whole and in order with its sources; a handler that closes the socket mid-burst
ends the reading quietly; a send that fails is logged, never raised. Real sockets on
loopback."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from provisioner.boot.sockets import READ_BATCH, Address, DatagramSocket, udp_socket


async def test_a_burst_arrives_whole_and_in_order() -> None:
    got: list[tuple[bytes, Address]] = []
    count = 3 * READ_BATCH + 5  # several wake-ups' worth
    all_in = asyncio.Event()

    def handle(data: bytes, source: Address, _bound: DatagramSocket) -> None:
        got.append((data, source))
        if len(got) == count:
            all_in.set()

    bound = DatagramSocket(udp_socket("127.0.0.1", 0), handle)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.bind(("127.0.0.1", 0))
            for n in range(count):  # all queued before the loop looks
                client.sendto(n.to_bytes(2, "big"), bound.get_extra_info("sockname"))
            async with asyncio.timeout(5):
                await all_in.wait()
            assert [int.from_bytes(data, "big") for data, _ in got] == list(range(count))
            assert {source for _, source in got} == {client.getsockname()}
    finally:
        bound.close()


async def test_a_handler_that_closes_the_socket_ends_the_burst_quietly() -> None:
    got: list[bytes] = []
    first = asyncio.Event()

    def handle(data: bytes, _source: Address, bound: DatagramSocket) -> None:
        got.append(data)
        first.set()
        bound.close()

    bound = DatagramSocket(udp_socket("127.0.0.1", 0), handle)
    address = bound.get_extra_info("sockname")
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            for n in range(10):
                client.sendto(bytes([n]), address)
            async with asyncio.timeout(5):
                await first.wait()
            await asyncio.sleep(0.05)  # the rest of the burst had its chance to arrive
        assert got == [b"\x00"] and errors == []
        assert bound.get_extra_info("socket").fileno() == -1
        bound.close()  # twice is harmless
    finally:
        loop.set_exception_handler(None)


async def test_a_failed_send_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="provisioner.boot.sockets")
    bound = DatagramSocket(udp_socket("127.0.0.1", 0), lambda *_: None)
    try:
        bound.sendto(b"x" * 70_000, ("127.0.0.1", 9))  # larger than a UDP datagram
    finally:
        bound.close()
    assert "sending to 127.0.0.1 failed" in caplog.text
