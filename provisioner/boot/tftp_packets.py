"""TFTP packets (RFC 1350) and option negotiation (RFC 2347 blksize 2348, timeout and tsize
2349, windowsize 7440): what the listener parses and what a transfer answers. Pure."""

from __future__ import annotations

import struct
from dataclasses import dataclass

RRQ, WRQ, DATA, ACK, ERROR, OACK = 1, 2, 3, 4, 5, 6
#: what a listening port never answers (the CVE-2024-2169 class): these belong to a transfer,
#: and an ERROR sent back to their source, another TFTP server that answers the same way,
#: would start a loop between the two that one spoofed datagram keeps going for ever
NEVER_ANSWERED = frozenset({DATA, ACK, ERROR, OACK})
E_UNDEFINED, E_NOT_FOUND, E_ACCESS, E_ILLEGAL, E_UNKNOWN_TID, E_OPTIONS = 0, 1, 2, 4, 5, 8
MAX_BLKSIZE = 65464
MAX_WINDOWSIZE = 64
OPTIONS = frozenset({"blksize", "tsize", "timeout", "windowsize"})
HEAD = struct.Struct("!HH")


class TftpError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def opcode_of(data: bytes) -> int | None:
    """The datagram's opcode; None when it is too short to have one."""
    return int.from_bytes(data[:2], "big") if len(data) >= 2 else None


def answerable(data: bytes) -> bool:
    """Whether a listening port may answer this datagram at all (with a transfer or an
    ERROR): a request or something unknown; never a packet of a transfer, nor a runt."""
    opcode = opcode_of(data)
    return opcode is not None and opcode not in NEVER_ANSWERED


def error_packet(code: int, message: str) -> bytes:
    return HEAD.pack(ERROR, code) + message.encode("ascii", "replace") + b"\0"


@dataclass(frozen=True, slots=True)
class ReadRequest:
    filename: str
    mode: str
    options: dict[str, str]


def parse_request(data: bytes) -> ReadRequest:
    """An RRQ; TftpError (code and reason for the ERROR packet) for anything else."""
    if len(data) < 4:
        raise TftpError(E_ILLEGAL, "short packet")
    opcode = int.from_bytes(data[:2], "big")
    if opcode == WRQ:
        raise TftpError(E_ACCESS, "read-only server: writes are refused")
    if opcode != RRQ:
        raise TftpError(E_ILLEGAL, f"opcode {opcode} is not a request")
    fields = data[2:].split(b"\0")
    if len(fields) < 3 or fields[-1] != b"" or not fields[0]:
        raise TftpError(E_ILLEGAL, "malformed request")
    try:
        name, mode, *rest = (f.decode("utf-8") for f in fields[:-1])
    except UnicodeDecodeError:
        raise TftpError(E_ACCESS, "file name is not UTF-8") from None
    options = {rest[i].lower(): rest[i + 1] for i in range(0, len(rest) - 1, 2)}
    if mode.lower() not in ("octet", "netascii"):
        raise TftpError(E_ILLEGAL, f"mode {mode.lower()!r} is not supported")
    return ReadRequest(name, mode.lower(), options)


def negotiate(options: dict[str, str], size: int) -> dict[str, str]:
    """The options we accept (RFC 2347): what goes into the OACK, in request order."""
    accepted: dict[str, str] = {}
    for name, value in options.items():
        # ASCII digits only: str.isdigit() also takes "²" (int() refuses it), and a few
        # thousand digits overflow int()'s limit; no option needs more than 10
        if not (value.isascii() and value.isdigit() and len(value) <= 10):
            continue
        number = int(value)
        if name == "blksize" and number >= 8:
            accepted[name] = str(min(number, MAX_BLKSIZE))
        elif name == "tsize":
            accepted[name] = str(size)
        elif name == "timeout" and 1 <= number <= 255:
            accepted[name] = str(number)
        elif name == "windowsize" and number >= 1:
            accepted[name] = str(min(number, MAX_WINDOWSIZE))
    return accepted


def oack_packet(accepted: dict[str, str]) -> bytes:
    return OACK.to_bytes(2, "big") + b"".join(k.encode() + b"\0" + v.encode() + b"\0"
                                              for k, v in accepted.items())
