"""A loopback TCP proxy the test controls: ``cut()`` resets every connection through it and
refuses new ones (a daemon cut off from its database), ``restore()`` lets them through again.
``stall()`` black-holes instead: connections stay open and new ones are accepted, but no byte
goes either way (a peer that stopped answering, its TCP stack still up) until ``resume()``
delivers what was held back.
Threads, no event loop: the daemons it serves are other processes."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

from tests.peers.ports import free_tcp_port


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_tcp_port()
        self._open = True
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=64)
        self._closed = False
        self._flowing = threading.Event()
        self._flowing.set()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self._open = False
            socks, self._socks = self._socks, set()
        for sock in socks:
            _reset(sock)

    def restore(self) -> None:
        with self._lock:
            self._open = True

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self.cut()
        self._listener.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                allowed = self._open
            if not allowed:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._socks |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._socks -= {src, dst}


def _reset(sock: socket.socket) -> None:
    """Drop the connection so its peer sees it die at once: shutdown() wakes the pipe
    thread blocked in recv() on it (close() alone would wait for that recv to return),
    SO_LINGER 0 makes the close a reset."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@contextlib.contextmanager
def tcp_proxy(target_port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(target_port)
    try:
        yield proxy
    finally:
        proxy.close()
