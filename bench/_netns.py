"""What the namespace benches share: shell calls, a server and a client namespace joined by
a veth pair (``vs0`` / ``vc0``), waiting for a listening port, stopping a server."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def add_namespace(ns: str) -> None:
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")


def join(a: str, a_if: str, a_addr: str, b: str, b_if: str, b_addr: str) -> None:
    """A veth pair between namespaces ``a`` and ``b``, ``a_if`` with ``a_addr`` (CIDR) in
    ``a``, ``b_if`` with ``b_addr`` in ``b``, both up."""
    sh("ip", "link", "add", a_if, "netns", a, "type", "veth", "peer", "name", b_if, "netns", b)
    for ns, link, addr in ((a, a_if, a_addr), (b, b_if, b_addr)):
        sh("ip", "-n", ns, "addr", "add", addr, "dev", link)
        sh("ip", "-n", ns, "link", "set", link, "up")


@contextmanager
def veth_pair(tag: str, server: str, client: str, *,
              routes: Sequence[Sequence[str]] = ()) -> Iterator[tuple[str, str]]:
    """Namespaces ``pv<tag>s<pid>`` (server, ``server``/16 on ``vs0``) and ``pv<tag>c<pid>``
    (client, ``client``/16 on ``vc0``); ``routes``: extra ``ip`` arguments run after, with
    ``{srv}``/``{cli}`` standing for the namespaces' names. Deleted on the way out."""
    srv, cli = f"pv{tag}s{os.getpid()}", f"pv{tag}c{os.getpid()}"
    try:
        for ns in (srv, cli):
            add_namespace(ns)
        join(srv, "vs0", f"{server}/16", cli, "vc0", f"{client}/16")
        for route in routes:
            sh("ip", *(arg.format(srv=srv, cli=cli) for arg in route))
        yield srv, cli
    finally:
        sh("ip", "netns", "del", cli, check=False)
        sh("ip", "netns", "del", srv, check=False)


def listening(ns: str, proto: str, port: int) -> bool:
    """Does something in ``ns`` (``""``: this namespace) listen on ``port`` (``proto``:
    ``u`` UDP, ``t`` TCP)?"""
    inside = ("ip", "netns", "exec", ns) if ns else ()
    return bool(sh(*inside, "ss", f"-Hl{proto}n", f"sport = :{port}").stdout.strip())


def wait_listening(ns: str, proto: str, port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not listening(ns, proto, port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {proto} {port} in {ns}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
