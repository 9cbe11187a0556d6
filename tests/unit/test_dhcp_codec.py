"""The DHCP codec on packets captured from real clients (tests/fixtures/dhcp, see capture.sh)
and on fuzzed input: random and mutated bytes never raise anything but DhcpParseError."""

from __future__ import annotations

import contextlib
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.boot.dhcp_codec import (
    MAGIC_COOKIE,
    DhcpPacket,
    DhcpParseError,
    MessageType,
    Op,
    Opt,
    encode,
    encode_option,
    parse,
    parse_suboptions,
    u8,
)
from provisioner.boot.dhcp_reply import boot_request
from provisioner.boot.policy import ClientClass, classify

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dhcp"
CAPTURED = sorted(FIXTURES.glob("*.hex"))


def _load(name: str) -> bytes:
    lines = (FIXTURES / f"{name}.hex").read_text().splitlines()
    assert lines[0].startswith("# provenance: ")
    return bytes.fromhex(lines[-1])


def test_fixtures_cover_every_client() -> None:
    names = {path.stem for path in CAPTURED}
    for client in ("ipxe_bios", "ipxe_efi", "ovmf_pxe", "dhclient", "udhcpc"):
        assert {f"{client}_discover", f"{client}_request"} <= names


@pytest.mark.parametrize("path", CAPTURED, ids=lambda p: p.stem)
def test_captured_packets_round_trip_byte_for_byte(path: Path) -> None:
    raw = _load(path.stem)
    packet = parse(raw)
    assert encode(packet, min_size=len(raw)) == raw
    assert parse(encode(packet)) == packet


_FINGERPRINTS = {
    # name: (vendor class, arch, user class, option 175, NDI, class)
    "ipxe_bios_discover": ("PXEClient:Arch:00000:UNDI:002001", (0,), (b"iPXE",), True,
                           (1, 2, 1), ClientClass.IPXE),
    "ipxe_efi_discover": ("PXEClient:Arch:00007:UNDI:003010", (7,), (b"iPXE",), True,
                          (1, 3, 10), ClientClass.IPXE),
    "ovmf_pxe_discover": ("PXEClient:Arch:00007:UNDI:003000", (7,), (), False, (1, 3, 0),
                          ClientClass.UEFI_X64),
    "udhcpc_discover": ("udhcp 1.35.0", (), (), False, None, None),
    "dhclient_discover": (None, (), (), False, None, None),
}


@pytest.mark.parametrize("name", sorted(_FINGERPRINTS))
def test_captured_fingerprints(name: str) -> None:
    vendor, arch, user, ipxe, ndi, client = _FINGERPRINTS[name]
    packet = parse(_load(name))
    assert packet.op == Op.BOOTREQUEST and packet.message_type is MessageType.DISCOVER
    assert packet.vendor_class == vendor and packet.client_arches == arch
    assert packet.user_classes == user and (Opt.IPXE_ENCAP in packet.options) == ipxe
    assert packet.client_ndi == ndi
    assert classify(boot_request(packet)) == client
    if vendor and vendor.startswith("PXEClient"):
        assert packet.client_uuid is not None and len(packet.client_uuid) == 16
        assert packet.max_message_size is not None


def test_captured_request_and_reply_fields() -> None:
    request = parse(_load("ovmf_pxe_request"))
    assert request.message_type is MessageType.REQUEST
    assert request.server_id == IPv4Address("10.77.0.1")
    assert request.requested_ip is not None and request.mac == "52:54:00:77:00:11"
    offer = parse(_load("dnsmasq_to_ipxe_bios_offer"))
    assert offer.op == Op.BOOTREPLY and offer.message_type is MessageType.OFFER
    assert offer.bootfile_name == "http://10.77.0.1:8000/boot.ipxe"
    assert offer.ipxe_options == {176: b"\x01"}
    assert offer.lease_time == 3600 and offer.subnet_mask == IPv4Address("255.255.255.0")
    assert offer.routers == (IPv4Address("10.77.0.1"),)
    ack = parse(_load("dnsmasq_to_ovmf_pxe_ack"))
    assert ack.siaddr == IPv4Address("10.77.0.1") and ack.bootfile_name == "snponly.efi"
    release = parse(_load("dhclient_release"))
    assert release.message_type is MessageType.RELEASE and release.ciaddr != IPv4Address(0)


def _packet(options: dict[int, bytes], **fields: object) -> DhcpPacket:
    return DhcpPacket(op=Op.BOOTREQUEST, xid=0x1234, chaddr=bytes.fromhex("525400770099") +
                      bytes(10), options={Opt.MESSAGE_TYPE: u8(1), **options},
                      **fields)  # type: ignore[arg-type]


def test_unknown_options_survive_in_order() -> None:
    packet = _packet({224: b"private", 12: b"host", 250: b"", 3: bytes(4)})
    again = parse(encode(packet))
    assert list(again.options) == [53, 224, 12, 250, 3]
    assert again.options[224] == b"private" and again.options[250] == b""


def test_long_options_are_split_and_concatenated() -> None:
    value = bytes(range(256)) * 3  # 768 bytes: four instances on the wire (RFC 3396)
    raw = encode(_packet({Opt.VENDOR_SPECIFIC: value}))
    assert raw.count(bytes((Opt.VENDOR_SPECIFIC, 255))) >= 3
    assert parse(raw).options[Opt.VENDOR_SPECIFIC] == value


def test_option_overload_reads_file_then_sname() -> None:
    base = encode(_packet({Opt.OVERLOAD: b"\x03"}))
    file_area = (encode_option(Opt.HOSTNAME, b"in-file") + b"\xff").ljust(128, b"\0")
    sname_area = (encode_option(Opt.VENDOR_CLASS, b"in-sname") + b"\xff").ljust(64, b"\0")
    raw = base[:44] + sname_area + file_area + base[236:]
    packet = parse(raw)
    assert packet.hostname == "in-file" and packet.vendor_class == "in-sname"
    assert packet.file == b"" and packet.sname == b""
    assert list(packet.options) == [53, 52, 12, 60]


@pytest.mark.parametrize(("raw", "reason"), [
    (b"", "shorter than 240"),
    (bytes(239), "shorter than 240"),
    (b"\x03" + bytes(239), "op 3"),
    (b"\x01\x01\x11" + bytes(237), "hardware address length 17"),
    (b"\x01\x01\x06" + bytes(233) + b"\x00\x00\x00\x00", "magic cookie"),
    (b"\x01\x01\x06" + bytes(233) + MAGIC_COOKIE + b"\x35", "cut off"),
    (b"\x01\x01\x06" + bytes(233) + MAGIC_COOKIE + b"\x35\x05\x01", "overruns"),
    (b"\x01\x01\x06" + bytes(233) + MAGIC_COOKIE + b"\x34\x01\x07\xff", "overload"),
], ids=["empty", "short", "op", "hlen", "cookie", "cut", "overrun", "overload"])
def test_malformed_packets_name_the_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(DhcpParseError, match=reason):
        parse(raw)


def test_malformed_option_values_raise_parse_errors() -> None:
    packet = _packet({Opt.SERVER_ID: b"\x01\x02\x03", Opt.CLIENT_ARCH: b"\x00",
                      Opt.CLIENT_UUID: b"\x01" * 5, Opt.RELAY_AGENT_INFO: b"\x01\x09ab"})
    for accessor in ("server_id", "client_arches", "client_uuid", "relay_agent_info"):
        with pytest.raises(DhcpParseError):
            getattr(packet, accessor)


def test_suboptions() -> None:
    assert parse_suboptions(b"\x01\x02ab\x00\x02\x01c\xff\x09") == {1: b"ab", 2: b"c"}


def _touch_everything(packet: DhcpPacket) -> None:
    for name in ("mac", "broadcast", "relayed", "server_name", "boot_file", "message_type",
                 "server_id", "requested_ip", "subnet_mask", "lease_time", "max_message_size",
                 "routers", "dns_servers", "hostname", "vendor_class", "tftp_server_name",
                 "bootfile_name", "vendor_specific", "relay_agent_info", "ipxe_options",
                 "parameter_request_list", "client_id", "user_classes", "client_arches",
                 "client_ndi", "client_uuid"):
        with contextlib.suppress(DhcpParseError):
            getattr(packet, name)
    try:
        request = boot_request(packet)
    except DhcpParseError:
        return
    classify(request)


def assert_decodes_or_names_the_reason(raw: bytes) -> None:
    """Parsing, reading every field and classifying either work or raise DhcpParseError with
    a reason; any other exception fails the test."""
    try:
        packet = parse(raw)
    except DhcpParseError as exc:
        assert exc.reason
        return
    _touch_everything(packet)


_FUZZ = settings(max_examples=400, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.binary(max_size=700))
def test_fuzz_random_bytes(raw: bytes) -> None:
    assert_decodes_or_names_the_reason(raw)


@_FUZZ
@given(st.binary(max_size=460))
def test_fuzz_random_options_after_a_valid_header(tail: bytes) -> None:
    assert_decodes_or_names_the_reason(_load("ipxe_bios_discover")[:240] + tail)


@_FUZZ
@given(st.sampled_from(CAPTURED), st.data())
def test_fuzz_mutated_real_packets(path: Path, data: st.DataObject) -> None:
    raw = bytearray(_load(path.stem))
    for _ in range(data.draw(st.integers(1, 8))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if action == "flip" and raw:
            raw[pos] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del raw[pos:]
        elif action == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif raw:
            del raw[pos]
    assert_decodes_or_names_the_reason(bytes(raw))
