"""A DNS server whose answers the test decides: A records for the names in
`answers`, NXDOMAIN for any other name. UDP on 127.0.0.1 only, for the
egress proxy's resolver (`SIESTA_EGRESS_DNS`)."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading

TYPE_A = 1
CLASS_IN = 1


class DnsAnswer:
    def __init__(self, port: int):
        self.answers: dict[str, str] = {}
        self.asked: list[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", port))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self._sock.recvfrom(512)
            except socket.timeout:
                continue
            except OSError:
                return
            reply = self.reply(query)
            if reply is not None:
                self._sock.sendto(reply, peer)

    def reply(self, query: bytes) -> bytes | None:
        if len(query) < 12:
            return None
        qid, _flags, qdcount = struct.unpack("!HHH", query[:6])
        if qdcount != 1:
            return None
        name, end = _read_name(query, 12)
        if name is None or end + 4 > len(query):
            return None
        qtype, _qclass = struct.unpack("!HH", query[end:end + 4])
        question = query[12:end + 4]
        self.asked.append(name)
        addr = self.answers.get(name)
        rcode = 0 if addr is not None else 3  # NXDOMAIN
        records = b""
        count = 0
        if addr is not None and qtype == TYPE_A:
            # A pointer to the question's name, then type, class, TTL, data.
            records = struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, 5, 4)
            records += ipaddress.IPv4Address(addr).packed
            count = 1
        flags = 0x8180 | rcode  # response, recursion desired and available
        header = struct.pack("!HHHHHH", qid, flags, 1, count, 0, 0)
        return header + question + records


def _read_name(msg: bytes, at: int) -> tuple[str | None, int]:
    labels = []
    while at < len(msg):
        n = msg[at]
        at += 1
        if n == 0:
            return ".".join(labels).lower(), at
        if n & 0xC0 or at + n > len(msg):
            return None, at
        labels.append(msg[at:at + n].decode("ascii", "replace"))
        at += n
    return None, at
