"""OfferBook: addresses offered to a DHCP client and not yet requested, held in memory.

A DHCPOFFER promises nothing (RFC 2131 §3.1: the server *should* reserve the address; the
client may take another server's offer), and most offers of a boot storm are requested
within milliseconds. So an offer is not written to the store: it is reserved here, for this
server's later offers, until the hold runs out or the client binds it. Two DISCOVERs to this
server never get one address; the store's unique address still decides every *bound* lease,
also between several daemons (the loser's client is NAKed and starts again), and a crash
loses only offers, which clients re-ask for on their own.

The book is used only from the lease repository's store calls, which run one at a time
(``store/batch.py`` drains one batch after another), so it needs no lock of its own.
"""

from __future__ import annotations

from datetime import datetime
from ipaddress import IPv4Address

MAX_OFFERS = 65_536  # a made-up-MAC flood cannot grow the book past this (lapsed offers
# are dropped when it is full, by a bind, or by the repository's expire())


class OfferBook:
    def __init__(self, max_offers: int = MAX_OFFERS) -> None:
        self._by_ip: dict[IPv4Address, tuple[str, datetime]] = {}
        self._by_mac: dict[str, IPv4Address] = {}
        self._max = max_offers

    def __len__(self) -> int:
        return len(self._by_ip)

    def held_by_other(self, ip: IPv4Address, mac: str, now: datetime) -> bool:
        """Is ``ip`` promised to another MAC whose hold has not run out?"""
        held = self._by_ip.get(ip)
        return held is not None and held[0] != mac and held[1] > now

    def of(self, mac: str, now: datetime) -> IPv4Address | None:
        """The address promised to ``mac``, while its hold lasts."""
        ip = self._by_mac.get(mac)
        held = self._by_ip.get(ip) if ip is not None else None
        return ip if held is not None and held[0] == mac and held[1] > now else None

    def hold(self, mac: str, ip: IPv4Address, until: datetime, now: datetime) -> bool:
        """Promise ``ip`` to ``mac`` until ``until`` (its earlier offer, if any, is dropped);
        False when the book is full even after dropping lapsed offers."""
        self.drop(mac)
        if len(self._by_ip) >= self._max and self.expire(now) == 0:
            return False
        self._by_ip[ip] = (mac, until)
        self._by_mac[mac] = ip
        return True

    def drop(self, mac: str) -> None:
        """``mac`` bound, declined or chose another server: its offer is gone."""
        ip = self._by_mac.pop(mac, None)
        if ip is not None and self._by_ip.get(ip, ("", None))[0] == mac:
            del self._by_ip[ip]

    def expire(self, now: datetime) -> int:
        """Forget offers whose hold ran out; return how many."""
        lapsed = [(ip, mac) for ip, (mac, until) in self._by_ip.items() if until <= now]
        for ip, mac in lapsed:
            del self._by_ip[ip]
            if self._by_mac.get(mac) == ip:
                del self._by_mac[mac]
        return len(lapsed)
