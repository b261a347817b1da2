"""From inside a real guest: nothing of the node's network is reachable.

The test makes its own "outside" in a network namespace, routed from the
host through a veth: a fake cloud metadata service on 169.254.169.254, a
LAN host (10.77.N.2), a CGNAT host (100.64.N.2), and a public-range host
(198.19.N.2, the benchmarking range) that stands for the internet and
shows the method works. A host port is published to the public host with
DNAT, as `docker run -p` does. A second "instance's" slot stands beside the
server's: a namespace behind a host veth named as siesta names slots
(`svh<tag><n>`), with a listener, as a CLI template build's VM would be.
Every address is this machine's own test host; `ip route get` shows each
goes to the test's veth before anything is sent.

From one sandbox every way out is tried at once (each with a 3 s limit),
then again after its rules say `allowOut: 0.0.0.0/0`, then UDP from a forged
source address and MAC. Only the public host may answer, and only from the
sandbox's slot address.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from e2b import Sandbox

PORT = 8080
PUBLISHED = 18080
METADATA = "169.254.169.254"
HERE = Path(__file__).parent


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def _nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True)


class Outside:
    """The test's outside world; `close` removes it by exact names."""

    def __init__(self) -> None:
        n = 100 + os.getpid() % 100
        self.public, self.host_side = f"198.19.{n}.2", f"198.19.{n}.1"
        self.lan, self.cgnat = f"10.77.{n}.2", f"100.64.{n}.2"
        self.ns = f"siesta-esc-{os.getpid()}"
        self.host_if = f"vesc{os.getpid() % 100000}"
        self.table = f"siesta-esc-{os.getpid()}"
        # The other instance's slot.
        self.slot_ns = f"siesta-escq-{os.getpid()}"
        self.slot_if = f"svhzq{os.getpid() % 10000}"
        self.slot_host, self.slot_addr = f"10.249.{n}.1", f"10.249.{n}.2"
        self.routes: list[str] = []
        self.servers: list[subprocess.Popen] = []

    def build(self) -> None:
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", "out0", "netns", self.ns)
        _ip("addr", "add", f"{self.host_side}/24", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        for a in (self.public, self.lan, self.cgnat, METADATA):
            _ip("-n", self.ns, "addr", "add", f"{a}/32", "dev", "out0")
        _ip("-n", self.ns, "link", "set", "out0", "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")
        _ip("-n", self.ns, "route", "add", f"{self.host_side}/32", "dev", "out0")
        _ip("-n", self.ns, "route", "add", "default", "via", self.host_side)
        for a in (self.lan, self.cgnat, METADATA):
            _ip("route", "add", f"{a}/32", "via", self.public, "dev", self.host_if)
            self.routes.append(f"{a}/32")
        for a in (self.public, self.lan, self.cgnat, METADATA):
            via = _ip("route", "get", a)
            assert f"dev {self.host_if}" in via, f"{a} routes elsewhere: {via}"
        _nft(
            f"table ip {self.table} {{\n chain prerouting {{\n"
            f"  type nat hook prerouting priority dstnat;\n"
            f"  ip daddr {self.host_side} tcp dport {PUBLISHED} dnat to {self.public}:{PORT}\n"
            f" }}\n}}\n"
        )
        # Another instance's slot, named as siesta names them.
        _ip("netns", "add", self.slot_ns)
        _ip("link", "add", self.slot_if, "type", "veth", "peer", "name", "veth0", "netns", self.slot_ns)
        _ip("addr", "add", f"{self.slot_host}/30", "dev", self.slot_if)
        _ip("link", "set", self.slot_if, "up")
        _ip("-n", self.slot_ns, "addr", "add", f"{self.slot_addr}/30", "dev", "veth0")
        _ip("-n", self.slot_ns, "link", "set", "veth0", "up")
        _ip("-n", self.slot_ns, "link", "set", "lo", "up")
        _ip("-n", self.slot_ns, "route", "add", "default", "via", self.slot_host)
        listen = [(self.ns, a) for a in (self.public, self.lan, self.cgnat, METADATA)]
        listen.append((self.slot_ns, self.slot_addr))
        for ns, a in listen:
            self.servers.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "python3", str(HERE / "listener.py"), a, str(PORT)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for ns, a in listen:
            _wait_listening(ns, a)

    def seen(self) -> list[str]:
        """Every peer the listeners have reported so far: 'ADDR PROTO PEER'."""
        lines = []
        for p in self.servers:
            p.terminate()
            out, _ = p.communicate(timeout=10)
            lines += [line for line in out.splitlines() if line.strip()]
        self.servers.clear()
        return lines

    def close(self) -> None:
        for p in self.servers:
            p.kill()
            p.wait(timeout=10)
        for r in self.routes:
            subprocess.run(["ip", "route", "del", r], check=False, capture_output=True)
        for link in (self.host_if, self.slot_if):
            subprocess.run(["ip", "link", "del", link], check=False, capture_output=True)
        for ns in (self.ns, self.slot_ns):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["nft", "delete", "table", "ip", self.table], check=False, capture_output=True)


def _wait_listening(ns: str, addr: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        probe = subprocess.run(
            ["ip", "netns", "exec", ns, "python3", "-c",
             f"import socket; socket.create_connection(('{addr}', {PORT}), timeout=1)"],
            capture_output=True)
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"listener {addr} in {ns} never came up")


@pytest.fixture()
def outside(siesta):
    o = Outside()
    try:
        o.build()
        yield o
    finally:
        o.close()


def _reached(sbx: Sandbox, targets: list[tuple[str, int]]) -> list[str]:
    tries = " ".join(
        f"(timeout 3 bash -c 'echo > /dev/tcp/{a}/{p}' 2>/dev/null && echo open {a}:{p}) &"
        for a, p in targets
    )
    r = sbx.commands.run(f"{tries} wait", timeout=60)
    return sorted(line.split()[1] for line in r.stdout.splitlines() if line.startswith("open "))


SEND_UDP = (
    "python3 -c \"import socket,sys; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
    "s.bind((sys.argv[1],0)); s.sendto(sys.argv[2].encode(),(sys.argv[3],{port}))\""
)


def test_a_guest_reaches_the_internet_and_nothing_of_the_node(siesta, outside, attack):
    o = outside
    targets = {
        "cloud metadata service": (METADATA, PORT),
        "LAN host": (o.lan, PORT),
        "CGNAT host": (o.cgnat, PORT),
        "host port published with DNAT": (o.host_side, PUBLISHED),
        "another instance's slot": (o.slot_addr, PORT),
    }
    sbx = Sandbox.create("base", timeout=300)
    try:
        # The method works: the public host answers.
        assert _reached(sbx, [(o.public, PORT)]) == [f"{o.public}:{PORT}"]
        got = _reached(sbx, list(targets.values()))
        for name, (a, p) in targets.items():
            attack(name, f"{a}:{p}" in got)
        assert not got, f"sandbox {sbx.sandbox_id} reached {got}"

        # The sandbox's own rules cannot open any of it.
        r = siesta.api("PUT", f"/sandboxes/{sbx.sandbox_id}/network",
                       json={"allowOut": ["0.0.0.0/0"]})
        assert r.status_code == 204, r.text
        got = _reached(sbx, list(targets.values()))
        for name, (a, p) in targets.items():
            attack(f"{name} with allowOut 0.0.0.0/0", f"{a}:{p}" in got)
        assert not got, f"allowOut 0.0.0.0/0 opened {got}"

        # Forged source address, then forged MAC (restored in the same
        # command, so the agent's connection survives), then the guest's own.
        udp = SEND_UDP.format(port=PORT)
        forge = (
            f"ip addr add 169.254.0.25/32 dev eth0 && {udp} 169.254.0.25 forged-address {o.public}; "
            f"ip addr del 169.254.0.25/32 dev eth0; "
            f"ip link set eth0 address 02:fc:00:00:00:99 && {udp} 169.254.0.21 forged-mac {o.public}; "
            f"ip link set eth0 address 02:fc:00:00:00:15; "
            f"sleep 1; {udp} 169.254.0.21 own {o.public}"
        )
        sbx.commands.run(f"sudo sh -c '{forge}'", timeout=60)
        assert sbx.commands.run("echo alive").stdout.strip() == "alive"
        time.sleep(1)
        slot = siesta_slot_addr(siesta, sbx.sandbox_id)
    finally:
        sbx.kill()
    seen = o.seen()
    for what in ("forged-address", "forged-mac"):
        attack(f"UDP with a {what.replace('-', ' ')}", any(what in line for line in seen))
    own = [line for line in seen if "own" in line.split()]
    assert own, f"the guest's own datagram never arrived: {seen}"
    # Only the guest's own traffic arrived, at the public host, from its slot.
    for line in seen:
        addr, _proto, peer = line.split()[:3]
        assert addr == o.public and peer == slot, f"arrived: {line} (slot {slot})"


def siesta_slot_addr(siesta, sandbox_id: str) -> str:
    """The slot address the sandbox's traffic leaves with (SNAT): the
    namespace side of the slot's veth whose VMM runs this sandbox."""
    for ns in _ip("netns", "list").split("\n"):
        name = ns.split(" ")[0]
        if not name.startswith(f"siesta-{siesta.tag}-"):
            continue
        pids = _ip("netns", "pids", name).split()
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if sandbox_id.encode() in cmd:
                out = _ip("-n", name, "-4", "-o", "addr", "show", "dev", "veth0")
                return out.split()[3].split("/")[0]
    raise AssertionError(f"no slot runs {sandbox_id}")
