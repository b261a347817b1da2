"""What the fault tests do to and ask of a sandbox."""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

from e2b import Sandbox

TEMPLATE = "base"
DISK_FILE = "/home/user/fault-token"
# tmpfs: only in the guest's memory, so it survives only a memory restore.
MEMORY_FILE = "/dev/shm/fault-token"


@dataclass
class Marked:
    """A sandbox holding a random token on its disk and in its memory."""

    sandbox_id: str
    token: str


def create(tag: str, timeout: int = 900) -> Sandbox:
    return Sandbox.create(TEMPLATE, timeout=timeout, metadata={"fault": tag})


def mark(sbx: Sandbox) -> Marked:
    token = secrets.token_hex(8)
    sbx.files.write(DISK_FILE, token)
    sbx.commands.run(f"echo {token} > {MEMORY_FILE}")
    return Marked(sbx.sandbox_id, token)


def check_marked(sbx: Sandbox, m: Marked) -> None:
    """Both tokens are there: the disk and the memory came back."""
    assert sbx.files.read(DISK_FILE) == m.token, "the disk token is wrong"
    out = sbx.commands.run(f"cat {MEMORY_FILE}").stdout.strip()
    assert out == m.token, f"the memory token is {out!r}, not {m.token!r}"


def state(node, sandbox_id: str) -> str:
    """running, paused, dead (410) or gone (404)."""
    r = node.api("GET", f"/sandboxes/{sandbox_id}")
    if r.status_code == 200:
        return r.json()["state"]
    if r.status_code == 410:
        return "dead"
    assert r.status_code == 404, (r.status_code, r.text)
    return "gone"


def tagged(node, tag: str) -> list[dict]:
    """Every sandbox (any state) whose metadata has `fault: tag`."""
    r = node.api("GET", "/v2/sandboxes?state=running,paused,dead&limit=1000")
    assert r.status_code == 200, r.text
    return [s for s in r.json() if (s.get("metadata") or {}).get("fault") == tag]


def remove_tagged(node, tag: str) -> None:
    for s in tagged(node, tag):
        r = node.api("DELETE", f"/sandboxes/{s['sandboxID']}")
        assert r.status_code in (204, 404), r.text
    assert tagged(node, tag) == []


def resume_and_check(node, m: Marked) -> None:
    sbx = Sandbox.connect(m.sandbox_id, timeout=900)
    check_marked(sbx, m)


def kill_during(node, op: Callable[[], object], delay: float) -> BaseException | None:
    """Runs `op` and SIGKILLs the server `delay` seconds after it started
    (also if `op` returned before). Returns what `op` raised, if anything."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            op()
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            raised.append(e)

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    time.sleep(max(0.0, delay - (time.monotonic() - started)))
    node.kill9()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the operation hung after the server died"
    return raised[0] if raised else None


def timed(op: Callable[[], object]) -> float:
    started = time.monotonic()
    op()
    return time.monotonic() - started


def vmm_pid(home, sandbox_id: str) -> int | None:
    """The QEMU process whose open files are in the sandbox's directory."""
    from pathlib import Path

    prefix = f"{home}/sandboxes/{sandbox_id}/"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if not (proc / "comm").read_text().startswith("qemu-system"):
                continue
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd).startswith(prefix):
                    return int(proc.name)
        except OSError:
            continue
    return None


def wait_state(node, sandbox_id: str, wanted: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        s = state(node, sandbox_id)
        if s in wanted or time.monotonic() > deadline:
            return s
        time.sleep(0.5)


def paused_file(home, sandbox_id: str, role: str):
    """Path of file `role` of the sandbox's paused snapshot."""
    import json
    from pathlib import Path

    repo = Path(home) / "repo"
    snap = (repo / "aliases" / f"sandbox:{sandbox_id}").read_text().strip()
    record = json.loads((repo / "snapshots" / snap / "record.json").read_text())
    f = record["files"][role]
    if f["in"] == "blob":
        return repo / "blobs" / f["sha256"]
    return repo / "snapshots" / snap / f["name"]


def flip_byte(path, offset: int) -> int:
    """Inverts one byte in place; returns its old value."""
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([old ^ 0xFF]))
    return old


def put_byte(path, offset: int, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes([value]))
