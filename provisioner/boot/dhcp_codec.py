"""DHCPv4 wire format (RFC 2131/2132): bytes <-> DhcpPacket. Pure: stdlib and errors only.

Parsing never raises anything but DhcpParseError. Options keep the order they arrived in;
unknown options are kept as bytes and written back unchanged. Option overload (52) is
resolved on parse (RFC 2131 §4.1: options, then ``file``, then ``sname``), and instances of
one code are concatenated (RFC 3396). Typed accessors raise DhcpParseError for a present
option whose value is malformed, and return None (or an empty tuple) for an absent one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from ipaddress import IPv4Address
from types import MappingProxyType

from provisioner.errors import ProvisionerError

MAGIC_COOKIE = b"\x63\x82\x53\x63"
HEADER = struct.Struct("!BBBBIHH4s4s4s4s16s64s128s")
MIN_PACKET = HEADER.size + len(MAGIC_COOKIE)  # 240
BOOTP_MIN_SIZE = 300  # replies are padded to the BOOTP minimum; some clients insist on it
BROADCAST_FLAG = 0x8000
ZERO_IP = IPv4Address(0)

_PAD, _END = 0, 255


class DhcpParseError(ProvisionerError):
    """A DHCP packet (or one of its options) is malformed; ``reason`` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Op(IntEnum):
    BOOTREQUEST = 1
    BOOTREPLY = 2


class MessageType(IntEnum):
    DISCOVER = 1
    OFFER = 2
    REQUEST = 3
    DECLINE = 4
    ACK = 5
    NAK = 6
    RELEASE = 7
    INFORM = 8


class Opt(IntEnum):
    SUBNET_MASK = 1
    ROUTER = 3
    DNS_SERVERS = 6
    HOSTNAME = 12
    DOMAIN_NAME = 15
    BROADCAST_ADDRESS = 28
    VENDOR_SPECIFIC = 43
    REQUESTED_IP = 50
    LEASE_TIME = 51
    OVERLOAD = 52
    MESSAGE_TYPE = 53
    SERVER_ID = 54
    PARAMETER_REQUEST_LIST = 55
    MESSAGE = 56
    MAX_MESSAGE_SIZE = 57
    RENEWAL_TIME = 58
    REBINDING_TIME = 59
    VENDOR_CLASS = 60
    CLIENT_ID = 61
    TFTP_SERVER_NAME = 66
    BOOTFILE_NAME = 67
    USER_CLASS = 77
    RELAY_AGENT_INFO = 82
    CLIENT_ARCH = 93
    CLIENT_NDI = 94
    CLIENT_UUID = 97
    IPXE_ENCAP = 175


@dataclass(frozen=True, slots=True)
class DhcpPacket:
    op: int
    xid: int
    chaddr: bytes  # the 16-byte field as sent
    options: Mapping[int, bytes] = field(default_factory=dict, hash=False)
    htype: int = 1
    hlen: int = 6
    hops: int = 0
    secs: int = 0
    flags: int = 0
    ciaddr: IPv4Address = ZERO_IP
    yiaddr: IPv4Address = ZERO_IP
    siaddr: IPv4Address = ZERO_IP
    giaddr: IPv4Address = ZERO_IP
    sname: bytes = b""  # without trailing NULs; empty when overloaded with options
    file: bytes = b""

    # -- header views -------------------------------------------------------------------------

    @property
    def mac(self) -> str | None:
        """``aa:bb:cc:dd:ee:ff`` for Ethernet (htype 1, hlen 6), else None."""
        if self.htype != 1 or self.hlen != 6:
            return None
        return self.chaddr[:6].hex(":")

    @property
    def broadcast(self) -> bool:
        return bool(self.flags & BROADCAST_FLAG)

    @property
    def relayed(self) -> bool:
        return self.giaddr != ZERO_IP

    @property
    def server_name(self) -> str:
        return self.sname.decode("latin-1")

    @property
    def boot_file(self) -> str:
        return self.file.decode("latin-1")

    # -- typed options --------------------------------------------------------------------------

    @property
    def message_type(self) -> MessageType | None:
        value = self._fixed(Opt.MESSAGE_TYPE, 1)
        if value is None or value[0] not in MessageType._value2member_map_:
            return None
        return MessageType(value[0])

    @property
    def server_id(self) -> IPv4Address | None:
        return self._ip(Opt.SERVER_ID)

    @property
    def requested_ip(self) -> IPv4Address | None:
        return self._ip(Opt.REQUESTED_IP)

    @property
    def subnet_mask(self) -> IPv4Address | None:
        return self._ip(Opt.SUBNET_MASK)

    @property
    def lease_time(self) -> int | None:
        value = self._fixed(Opt.LEASE_TIME, 4)
        return None if value is None else int.from_bytes(value, "big")

    @property
    def max_message_size(self) -> int | None:
        value = self._fixed(Opt.MAX_MESSAGE_SIZE, 2)
        return None if value is None else int.from_bytes(value, "big")

    @property
    def routers(self) -> tuple[IPv4Address, ...]:
        return self._ips(Opt.ROUTER)

    @property
    def dns_servers(self) -> tuple[IPv4Address, ...]:
        return self._ips(Opt.DNS_SERVERS)

    @property
    def hostname(self) -> str | None:
        return self._text(Opt.HOSTNAME)

    @property
    def vendor_class(self) -> str | None:
        return self._text(Opt.VENDOR_CLASS)

    @property
    def tftp_server_name(self) -> str | None:
        return self._text(Opt.TFTP_SERVER_NAME)

    @property
    def bootfile_name(self) -> str | None:
        return self._text(Opt.BOOTFILE_NAME)

    @property
    def vendor_specific(self) -> Mapping[int, bytes] | None:
        return self._encapsulated(Opt.VENDOR_SPECIFIC)

    @property
    def relay_agent_info(self) -> Mapping[int, bytes] | None:
        return self._encapsulated(Opt.RELAY_AGENT_INFO)

    @property
    def ipxe_options(self) -> Mapping[int, bytes] | None:
        return self._encapsulated(Opt.IPXE_ENCAP)

    @property
    def parameter_request_list(self) -> tuple[int, ...]:
        return tuple(self.options.get(Opt.PARAMETER_REQUEST_LIST, b""))

    @property
    def client_id(self) -> bytes | None:
        return self.options.get(Opt.CLIENT_ID)

    @property
    def user_classes(self) -> tuple[bytes, ...]:
        """Option 77 as RFC 3004 items; a value that is not RFC 3004 (iPXE sends the bare
        string ``iPXE``) is one item."""
        raw = self.options.get(Opt.USER_CLASS)
        if raw is None:
            return ()
        items: list[bytes] = []
        pos = 0
        while pos < len(raw):
            size = raw[pos]
            if size == 0 or pos + 1 + size > len(raw):
                return (raw,)
            items.append(raw[pos + 1 : pos + 1 + size])
            pos += 1 + size
        return tuple(items)

    @property
    def client_arches(self) -> tuple[int, ...]:
        raw = self.options.get(Opt.CLIENT_ARCH)
        if raw is None:
            return ()
        if not raw or len(raw) % 2:
            raise DhcpParseError(f"option 93 has length {len(raw)}, expected a multiple of 2")
        return tuple(int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2))

    @property
    def client_ndi(self) -> tuple[int, int, int] | None:
        value = self._fixed(Opt.CLIENT_NDI, 3)
        return None if value is None else (value[0], value[1], value[2])

    @property
    def client_uuid(self) -> bytes | None:
        """Option 97: the 16-byte machine UUID (type byte 0 dropped)."""
        raw = self.options.get(Opt.CLIENT_UUID)
        if raw is None:
            return None
        if len(raw) != 17 or raw[0] != 0:
            raise DhcpParseError(f"option 97 must be type 0 and 16 bytes, got {len(raw)} bytes")
        return raw[1:]

    def _fixed(self, code: int, size: int) -> bytes | None:
        raw = self.options.get(code)
        if raw is not None and len(raw) != size:
            raise DhcpParseError(f"option {code} has length {len(raw)}, expected {size}")
        return raw

    def _ip(self, code: int) -> IPv4Address | None:
        raw = self._fixed(code, 4)
        return None if raw is None else IPv4Address(raw)

    def _ips(self, code: int) -> tuple[IPv4Address, ...]:
        raw = self.options.get(code, b"")
        if len(raw) % 4:
            raise DhcpParseError(f"option {code} has length {len(raw)}, not a list of addresses")
        return tuple(IPv4Address(raw[i : i + 4]) for i in range(0, len(raw), 4))

    def _text(self, code: int) -> str | None:
        raw = self.options.get(code)
        return None if raw is None else raw.rstrip(b"\0").decode("latin-1")

    def _encapsulated(self, code: int) -> Mapping[int, bytes] | None:
        raw = self.options.get(code)
        return None if raw is None else parse_suboptions(raw, code)


# -- parsing -----------------------------------------------------------------------------------


def parse(data: bytes) -> DhcpPacket:
    """Decode one DHCP message; raise DhcpParseError (only) when it is malformed."""
    if len(data) < MIN_PACKET:
        raise DhcpParseError(f"packet of {len(data)} bytes is shorter than {MIN_PACKET}")
    (op, htype, hlen, hops, xid, secs, flags, ciaddr, yiaddr, siaddr, giaddr, chaddr,
     sname, file) = HEADER.unpack_from(data)
    if op not in (Op.BOOTREQUEST, Op.BOOTREPLY):
        raise DhcpParseError(f"op {op} is neither BOOTREQUEST nor BOOTREPLY")
    if hlen > 16:
        raise DhcpParseError(f"hardware address length {hlen} exceeds 16")
    if data[HEADER.size : MIN_PACKET] != MAGIC_COOKIE:
        raise DhcpParseError("no DHCP magic cookie")
    chunks: list[tuple[int, bytes]] = []
    overload = _scan(data[MIN_PACKET:], chunks, "options")
    if overload & 1:
        _scan(file, chunks, "file")
        file = b""
    if overload & 2:
        _scan(sname, chunks, "sname")
        sname = b""
    return DhcpPacket(
        op=op, htype=htype, hlen=hlen, hops=hops, xid=xid, secs=secs, flags=flags,
        ciaddr=IPv4Address(ciaddr), yiaddr=IPv4Address(yiaddr), siaddr=IPv4Address(siaddr),
        giaddr=IPv4Address(giaddr), chaddr=chaddr, sname=sname.rstrip(b"\0"),
        file=file.rstrip(b"\0"), options=_merge(chunks))


def _scan(area: bytes, out: list[tuple[int, bytes]], where: str) -> int:
    """Append the options of one area to ``out``; return the overload value found (0-3)."""
    overload = 0
    pos, end = 0, len(area)
    while pos < end:
        code = area[pos]
        if code == _END:
            return overload
        if code == _PAD:
            pos += 1
            continue
        if pos + 1 >= end:
            raise DhcpParseError(f"option {code} in {where} is cut off before its length")
        size = area[pos + 1]
        if pos + 2 + size > end:
            raise DhcpParseError(f"option {code} in {where} overruns the packet")
        value = area[pos + 2 : pos + 2 + size]
        if code == Opt.OVERLOAD:
            if where != "options" or size != 1 or value[0] not in (1, 2, 3):
                raise DhcpParseError(f"invalid option overload in {where}")
            overload = value[0]
        out.append((code, value))
        pos += 2 + size
    return overload  # no end marker: tolerated (some ROMs omit it)


def _merge(chunks: Iterable[tuple[int, bytes]]) -> Mapping[int, bytes]:
    merged: dict[int, bytes] = {}
    for code, value in chunks:
        merged[code] = merged.get(code, b"") + value
    return MappingProxyType(merged)


def parse_suboptions(raw: bytes, code: int = 0) -> Mapping[int, bytes]:
    """Encapsulated options (43, 82, 175): code, length, value; pad and end allowed."""
    out: dict[int, bytes] = {}
    pos = 0
    while pos < len(raw):
        sub = raw[pos]
        if sub == _END:
            break
        if sub == _PAD:
            pos += 1
            continue
        if pos + 1 >= len(raw) or pos + 2 + raw[pos + 1] > len(raw):
            raise DhcpParseError(f"sub-option {sub} of option {code} overruns its option")
        out[sub] = out.get(sub, b"") + raw[pos + 2 : pos + 2 + raw[pos + 1]]
        pos += 2 + raw[pos + 1]
    return MappingProxyType(out)


# -- encoding ----------------------------------------------------------------------------------


_END_BYTE = bytes((_END,))


def encode(packet: DhcpPacket, *, min_size: int = 0) -> bytes:
    """Encode ``packet``; options in mapping order, values over 255 bytes split (RFC 3396).
    Pads with zeros to ``min_size`` (use BOOTP_MIN_SIZE for replies)."""
    if len(packet.sname) > 64 or len(packet.file) > 128 or len(packet.chaddr) > 16:
        raise ValueError("sname, file or chaddr too long for their fields")
    parts = [
        HEADER.pack(packet.op, packet.htype, packet.hlen, packet.hops, packet.xid, packet.secs,
                    packet.flags, packet.ciaddr.packed, packet.yiaddr.packed,
                    packet.siaddr.packed, packet.giaddr.packed, packet.chaddr, packet.sname,
                    packet.file),
        MAGIC_COOKIE,
    ]
    parts.extend(encode_option(code, value) for code, value in packet.options.items())
    parts.append(_END_BYTE)
    data = b"".join(parts)
    return data.ljust(min_size, b"\0")


def encode_option(code: int, value: bytes) -> bytes:
    if not 0 < code < 255:
        raise ValueError(f"option code {code} out of range")
    if len(value) <= 255:  # the usual option: one chunk (or none, empty)
        return bytes((code, len(value))) + value
    return b"".join(bytes((code, len(value[i : i + 255]))) + value[i : i + 255]
                    for i in range(0, len(value), 255))


def u8(value: int) -> bytes:
    return value.to_bytes(1, "big")


def u16(value: int) -> bytes:
    return value.to_bytes(2, "big")


def u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def ips(*addresses: IPv4Address) -> bytes:
    return b"".join(address.packed for address in addresses)


def text(value: str) -> bytes:
    return value.encode("latin-1", errors="replace")
