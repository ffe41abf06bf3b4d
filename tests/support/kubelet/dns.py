"""Cluster DNS: A records for Services from their EndpointSlices (what CoreDNS answers, minus
ClusterIPs: there is no kube-proxy, so every Service resolves to its endpoints' addresses)."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Callable

#: name (lower case, no trailing dot) -> addresses; None: a name this server owns but lacks
Lookup = Callable[[str], "list[str] | None"]


def parse_question(packet: bytes) -> tuple[int, int, str, int, int] | None:
    """(id, flags, qname, qtype, end of the question) of a query, None when malformed."""
    if len(packet) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        return None
    labels, at = [], 12
    while at < len(packet):
        length = packet[at]
        at += 1
        if length == 0:
            break
        if length & 0xC0 or at + length > len(packet):
            return None
        labels.append(packet[at:at + length].decode("ascii", "replace"))
        at += length
    if at + 4 > len(packet):
        return None
    qtype, _ = struct.unpack("!HH", packet[at:at + 4])
    return ident, flags, ".".join(labels).lower(), qtype, at + 4


def answer(packet: bytes, lookup: Lookup) -> bytes | None:
    """The response to one query: A records, NODATA for other types of a known name, NXDOMAIN
    for an unknown one (no upstream: nothing outside this machine is reachable)."""
    parsed = parse_question(packet)
    if parsed is None:
        return None
    ident, flags, name, qtype, end = parsed
    addresses = lookup(name)
    rcode = 3 if addresses is None else 0
    records = [a for a in addresses or []] if qtype == 1 else []
    header = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | (flags & 0x0100) | 0x0080 | rcode,
                         1, len(records), 0, 0)
    body = packet[12:end]
    for address in records:
        body += struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(address)
    return header + body


class DnsServer:
    """UDP DNS on (host, 53) in a thread, answering from `lookup`."""

    def __init__(self, host: str, lookup: Lookup, port: int = 53) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.lookup = lookup
        self.thread = threading.Thread(target=self._serve, daemon=True, name="dns")
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                packet, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            try:
                response = answer(packet, self.lookup)
            except Exception:  # noqa: BLE001 - one bad query must not stop the server
                response = None
            if response is not None:
                self.sock.sendto(response, peer)

    def close(self) -> None:
        self.sock.close()


def service_records(services: list[dict], slices: list[dict], domain: str) -> dict[str, list[str]]:
    """`<svc>.<ns>.svc.<domain>` -> the ready (or published not-ready) endpoint addresses."""
    by_service: dict[tuple[str, str], list[str]] = {}
    for s in slices:
        meta = s.get("metadata") or {}
        key = (meta.get("namespace", ""), (meta.get("labels") or {}).get("kubernetes.io/service-name", ""))
        for endpoint in s.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            by_service.setdefault(key, []).extend(endpoint.get("addresses") or [])
    out = {}
    for svc in services:
        meta = svc["metadata"]
        key = (meta["namespace"], meta["name"])
        out[f"{meta['name']}.{meta['namespace']}.svc.{domain}"] = sorted(set(by_service.get(key, [])))
    return out
