"""A TFTP worker process: serves the requests that reach its own listening socket
(``tftp_service.py``), one of the daemon's ``SO_REUSEPORT`` group (``reuseport.py``).

Run as ``python -m provisioner.boot.tftp_worker --control FD --listen FD ...``. The daemon
bound the listening socket (port 69 needs no privilege here, and a replacement worker
takes over its predecessor's socket with whatever requests wait in it). The control
socket (SOCK_SEQPACKET, one JSON object a message) carries ``{"ready": pid}`` once, then
``{"log": [logger, level, text]}``, which the daemon re-emits through its own logging;
the daemon closing it is the order to stop.

It dies with the daemon: ``PR_SET_PDEATHSIG`` (SIGKILL when the daemon's spawning thread
ends, SIGKILL of the daemon included) and, as a second guard, the end of the control
socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

from provisioner.boot.tftp_service import TftpService
from provisioner.boot.tftp_transfer import raise_fd_limit
from provisioner.boot.worker_channel import Channel, attach, log_to, watch, worker_parser

log = logging.getLogger(__name__)


async def serve(channel: Channel, service: TftpService, listening: socket.socket) -> None:
    """Until the daemon closes the control socket."""
    service.start(listening)
    gone = watch(channel, lambda _message: None)  # the daemon sends nothing: ignored
    channel.send({"ready": os.getpid()})
    try:
        await gone
    finally:
        await service.stop()


def main() -> None:
    parser = worker_parser(__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--retries", type=int, required=True)
    parser.add_argument("--max-transfers", type=int, required=True)
    parser.add_argument("--max-per-source", type=int, required=True)
    parser.add_argument("--cache-bytes", type=int, required=True)
    parser.add_argument("--max-fds", type=int, required=True)
    args = parser.parse_args()
    channel, listening = attach(args)
    log_to(channel, args.log_level)
    raise_fd_limit(args.max_fds)
    service = TftpService(args.root, host=args.host, timeout_s=args.timeout_s,
                          retries=args.retries, max_transfers=args.max_transfers,
                          max_per_source=args.max_per_source, cache_bytes=args.cache_bytes)
    asyncio.run(serve(channel, service, listening))
    os._exit(0)  # the daemon closed the control socket: transfers end with the process


if __name__ == "__main__":
    main()
