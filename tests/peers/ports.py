"""Helpers for the peers a test starts: free loopback ports, stopping by PID."""

from __future__ import annotations

import signal
import socket
import subprocess


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_udp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0,
                 sig: int = signal.SIGTERM) -> None:
    """Stop a peer by PID: ``sig`` (SIGTERM), wait ``timeout_s``, then SIGKILL (PEERS.md §0)."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
