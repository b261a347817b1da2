"""A build VM's QEMU and the step cache other builds reuse.

A template build runs each step in one VM and keeps the disk after each
step as a cached layer that later builds sharing those steps start from.
The VM's QEMU keeps every overlay it ever wrote open read-write until it
exits, so if a cached layer were one of those files, a QEMU taken over in
a later step could rewrite an earlier, innocent layer (say `apt-get
update`) that other builds then reuse, or change its header between
another build's check and open. The test starts a build with a slow last
step and, while it runs, checks that the build's QEMU holds no file the
cache names open for writing, and that it cannot drive the build's agent
without its token.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
from server import BINARY
from vmm_proc import find_qemu

O_ACCMODE = 0o3


def _writable_files(pid: int) -> set[Path]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = Path(os.readlink(fd))
            flags = int((Path(f"/proc/{pid}/fdinfo") / fd.name).read_text().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if flags & O_ACCMODE != os.O_RDONLY:
            out.add(target)
    return out


def _cached_qcow2_layers(cache: Path) -> set[Path]:
    layers = set()
    for entry in cache.glob("*.json"):
        try:
            layer = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if layer.get("format") == "qcow2":
            layers.add(cache / layer["disk"])
    return layers


def test_a_build_vm_holds_no_cached_layer_writable(siesta, attack, tmp_path):
    name = "escape-layers"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM base\nRUN echo one-{os.getpid()} > /one\nRUN echo two > /two\nRUN sleep 40\n"
    )
    log = tmp_path / "build.log"
    cache = siesta.home / "cache" / "steps"
    with open(log, "wb") as out:
        build = subprocess.Popen(
            [str(BINARY), "template", "build", "--file", "Dockerfile", name, str(ctx)],
            env=dict(os.environ, SIESTA_HOME=str(siesta.home)),
            cwd=ctx, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        # Wait for the slow step: both writing steps frozen and cached.
        deadline = time.monotonic() + 600
        while "RUN sleep 40" not in log.read_text(errors="replace"):
            assert build.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.5)
        pid = find_qemu(f"build-{name}")
        assert pid is not None, "no QEMU for the build"
        layers = _cached_qcow2_layers(cache)
        assert len(layers) >= 2, f"the cache names {layers}"
        writable = _writable_files(pid)
        shared = layers & writable
        attack("a build VM holds a cached layer writable", bool(shared))
        assert not shared, shared
        # The VM does write: its own overlays, which the cache does not name.
        assert any(p.suffix == ".qcow2" for p in writable), writable

        # Its agent answers only with the build's token.
        addrs = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        # A CLI build's slots: host ends 10.254.x.1 on svh* links.
        slot_addrs = re.findall(r"svh\S*\s+inet (10\.254\.\d+\.\d+)/", addrs)
        assert slot_addrs, addrs
        for host_side in slot_addrs:
            a, b, c, d = host_side.split(".")
            guest = f"{a}.{b}.{c}.{int(d) + 1}"
            r = httpx.post(f"http://{guest}:49983/init", json={"accessToken": "mine"}, timeout=10)
            attack("a local user drives a build VM's agent", r.status_code < 400)
            assert r.status_code == 401, r.text
        assert build.wait(timeout=600) == 0, log.read_text(errors="replace")
    finally:
        if build.poll() is None:
            build.kill()
            build.wait()
        subprocess.run(
            [str(BINARY), "template", "delete", name],
            env=dict(os.environ, SIESTA_HOME=str(siesta.home)),
            capture_output=True, check=False,
        )
