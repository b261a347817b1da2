"""The disk full during a pause: SIESTA_HOME (repository and sandboxes) on
a small loop-mounted ext4 file system of its own, filled up to a few MiB
before the pause. The pause is refused with an error that says the disk
is full, the sandbox keeps running with everything it had, and once space
is freed it pauses and resumes whole."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from e2b import Sandbox
from helpers import check_marked, mark, state
from server import BINARY, REAL_HOME, SiestaServer, share_template

# Room for the base template's allocated blocks (about 0.75 GiB), the 1 GiB
# free that `siesta serve` wants at start, one
# sandbox's disk copy (about 0.6 GiB) and a little more.
FS_MIB = 2600


@pytest.fixture()
def full_node(node, tmp_path_factory):
    scratch = Path(tempfile.mkdtemp(prefix="siesta-faults-full-", dir="/var/tmp"))
    image, mount = scratch / "fs.img", scratch / "home"
    mount.mkdir()
    subprocess.run(["truncate", "-s", f"{FS_MIB}M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    log = tmp_path_factory.mktemp("full") / "siesta.log"
    server = SiestaServer(BINARY, mount, log, second=True)
    try:
        (mount / "assets").symlink_to(REAL_HOME / "assets")
        share_template(REAL_HOME / "repo", mount / "repo", "base")
        server.start()
        yield server
    finally:
        server.stop_and_clean()
        print(f"\nsiesta log: {log}\n{server.log_tail(20)}")
        subprocess.run(["umount", str(mount)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)


def test_pause_on_a_full_disk_is_refused_and_loses_nothing(full_node):
    api = full_node
    r = api.api("POST", "/sandboxes", json={"templateID": "base", "timeout": 600})
    assert r.status_code == 201, r.text
    created = r.json()
    sbx = Sandbox.connect(created["sandboxID"], api_key=api.api_key(), api_url=api.url,
                          sandbox_url=api.url)
    m = mark(sbx)
    # Dirty some memory so the save has pages to write.
    sbx.commands.run("head -c 32M /dev/urandom > /dev/shm/ballast")
    filler = Path(api.home) / "filler"
    free = shutil.disk_usage(api.home).free
    subprocess.run(["fallocate", "-l", str(max(0, free - (2 << 20))), str(filler)], check=True)
    try:
        r = api.api("POST", f"/sandboxes/{m.sandbox_id}/pause", json={}, timeout=300)
        assert r.status_code >= 400, r.text
        message = r.json()["message"]
        assert "space" in message.lower() or "full" in message.lower(), message
        # Nothing lost: still running, with its disk and memory.
        assert state(api, m.sandbox_id) == "running"
        check_marked(sbx, m)
    finally:
        filler.unlink()
    r = api.api("POST", f"/sandboxes/{m.sandbox_id}/pause", json={}, timeout=300)
    assert r.status_code == 204, r.text
    again = Sandbox.connect(m.sandbox_id, api_key=api.api_key(), api_url=api.url,
                            sandbox_url=api.url)
    check_marked(again, m)
    assert api.api("DELETE", f"/sandboxes/{m.sandbox_id}").status_code == 204
