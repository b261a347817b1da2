"""Clients that hang up mid-operation (issue 42): raw HTTP requests for a
create, pause, resume, snapshot, fork or kill, the connection reset 5-500
ms after the request was sent (seeded, like the kill points). The
operation must finish or leave no trace on its own: afterwards every
sandbox involved is whole (running or paused, its disk and memory tokens
intact once connected), a create or fork made at most what it was asked
for, and `test_zz_nothing_left` finds no slot, namespace, VMM or directory
left once everything is deleted.

Without operations that outlive their requests, a `connect` abandoned a
few times left a paused sandbox whose disk had been taken, answering every
later resume with 500 ("snapshot ... is corrupt")."""

from __future__ import annotations

import json
import random
import socket
import struct
import time
from urllib.parse import urlparse

import pytest
from e2b import Sandbox
from helpers import Marked, check_marked, create, mark, remove_tagged, state, tagged, wait_state

from conftest import SEED

# Hang-ups per operation (18 in all): enough to land before, inside and
# after each stage of a few-second operation across seeds.
PER_OP = 3
OPS = ["create", "pause", "resume", "snapshot", "fork", "kill"]
HANGUPS = [
    (op, round(random.Random(f"{SEED}-{op}-{i}").uniform(0.005, 0.5), 3))
    for op in OPS
    for i in range(PER_OP)
]
HUNG_UP: list[str] = []


def hang_up(node, method: str, path: str, body: dict | None, after: float) -> None:
    """Sends the request, waits `after` seconds, then resets the
    connection (SO_LINGER 0: an RST, so the server sees it at once)."""
    url = urlparse(node.url)
    raw = json.dumps(body).encode() if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"X-API-Key: {node.api_key()}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n"
    ).encode()
    s = socket.create_connection((url.hostname, url.port), timeout=10)
    try:
        s.sendall(head + raw)
        time.sleep(after)
    finally:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    HUNG_UP.append(f"{method} {path.split('/')[-1] or path} after {after * 1000:.0f} ms")


def settled(node, sandbox_id: str) -> str:
    """Its state once no operation is under way on it (a request waits
    for the sandbox's lock, so a GET answering means the one before it
    finished)."""
    return wait_state(node, sandbox_id, {"running", "paused", "gone", "dead"}, timeout=300)


def whole(node, m: Marked) -> None:
    """Running or paused, and once connected its disk and memory tokens
    are both there."""
    s = settled(node, m.sandbox_id)
    assert s in ("running", "paused"), f"{m.sandbox_id} is {s} after a hang-up"
    check_marked(Sandbox.connect(m.sandbox_id, timeout=600), m)


@pytest.fixture(scope="module")
def marked(node):
    """One marked sandbox the pause, resume, snapshot and fork hang-ups
    share (they leave it whole, so the next can use it)."""
    tag = "hangup-shared"
    sbx = create(tag)
    m = mark(sbx)
    yield m
    remove_tagged(node, tag)


def _snapshots_of(node, sandbox_id: str) -> list[str]:
    r = node.api("GET", f"/snapshots?sandboxID={sandbox_id}")
    assert r.status_code == 200, r.text
    return [s["snapshotID"] for s in r.json()]


@pytest.mark.parametrize("op,after", HANGUPS, ids=[f"{op}-{int(a * 1000)}ms" for op, a in HANGUPS])
def test_hang_up(node, marked, op, after):
    if op == "create":
        tag = f"hangup-create-{int(after * 1000)}"
        body = {"templateID": "base", "timeout": 300, "metadata": {"fault": tag}}
        hang_up(node, "POST", "/sandboxes", body, after)
        # The create finishes or never started: at most one sandbox, and
        # a whole one.
        deadline = time.monotonic() + 120
        made = tagged(node, tag)
        while not made and time.monotonic() < deadline:
            time.sleep(1)
            made = tagged(node, tag)
        assert len(made) <= 1, made
        for s in made:
            sid = s["sandboxID"]
            assert settled(node, sid) == "running"
            out = Sandbox.connect(sid, timeout=300).commands.run("echo alive").stdout.strip()
            assert out == "alive"
        remove_tagged(node, tag)
        return

    m = marked
    if op == "pause":
        Sandbox.connect(m.sandbox_id, timeout=600)
        hang_up(node, "POST", f"/sandboxes/{m.sandbox_id}/pause", None, after)
        whole(node, m)
    elif op == "resume":
        if state(node, m.sandbox_id) != "paused":
            assert Sandbox.connect(m.sandbox_id, timeout=600).pause() is True
        hang_up(node, "POST", f"/sandboxes/{m.sandbox_id}/connect", {"timeout": 600}, after)
        whole(node, m)
        # Paused again and resumed the plain way: its pause is usable.
        sbx = Sandbox.connect(m.sandbox_id, timeout=600)
        assert sbx.pause() is True
        check_marked(Sandbox.connect(m.sandbox_id, timeout=600), m)
    elif op == "snapshot":
        Sandbox.connect(m.sandbox_id, timeout=600)
        before = set(_snapshots_of(node, m.sandbox_id))
        hang_up(node, "POST", f"/sandboxes/{m.sandbox_id}/snapshots", {}, after)
        whole(node, m)
        new = set(_snapshots_of(node, m.sandbox_id)) - before
        assert len(new) <= 1, new
        for snap in new:
            assert node.api("DELETE", f"/templates/{snap}").status_code in (204, 404)
    elif op == "fork":
        Sandbox.connect(m.sandbox_id, timeout=600)
        hang_up(node, "POST", f"/sandboxes/{m.sandbox_id}/fork", {"count": 2}, after)
        whole(node, m)
        # Children carry the source's metadata: at most the two asked for
        # (plus the source), each running and with the source's disk.
        time.sleep(1)
        kids = [s["sandboxID"] for s in tagged(node, "hangup-shared") if s["sandboxID"] != m.sandbox_id]
        assert len(kids) <= 2, kids
        for kid in kids:
            assert settled(node, kid) == "running"
            child = Sandbox.connect(kid, timeout=300)
            assert child.files.read("/home/user/fault-token") == m.token
            child.kill()
    elif op == "kill":
        tag = f"hangup-kill-{int(after * 1000)}"
        victim = mark(create(tag))
        hang_up(node, "DELETE", f"/sandboxes/{victim.sandbox_id}", None, after)
        s = settled(node, victim.sandbox_id)
        # Killed, or not yet begun: then it is whole.
        if s != "gone":
            whole(node, victim)
        remove_tagged(node, tag)
        assert state(node, victim.sandbox_id) == "gone"


def test_hang_ups_left_the_shared_sandbox_whole(node, marked):
    """After all of them, the shared sandbox pauses and resumes as ever."""
    sbx = Sandbox.connect(marked.sandbox_id, timeout=600)
    assert sbx.pause() is True
    check_marked(Sandbox.connect(marked.sandbox_id, timeout=600), marked)
