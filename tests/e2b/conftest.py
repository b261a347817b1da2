"""Runs the official E2B Python SDK against a real `siesta serve`.

One server per session, on a free loopback port, with its own SIESTA_HOME
(a temporary directory: `assets` symlinked to the real assets, the `base`
template linked in from the real home's repository when it has one, else
built there once),
its own network tag and subnet. E2B_API_URL, E2B_SANDBOX_URL,
E2B_VOLUME_API_URL and E2B_API_KEY point the SDK at it. At the end the server is stopped by pid
(SIGTERM, then SIGKILL), even when tests fail, and no network namespace of
its tag may remain.

Environment: SIESTA_BIN (default target/release/siesta), SIESTA_HOME (the
real home with assets, default /var/lib/siesta), SIESTA_E2B_KEEP=1 keeps the
temporary home for debugging.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from server import ROOT, SiestaServer, netns_of, pids_using

REAL_HOME = Path(os.environ.get("SIESTA_HOME", "/var/lib/siesta"))
BINARY = Path(os.environ.get("SIESTA_BIN", ROOT / "target/release/siesta"))


def _prepare_home() -> Path:
    assets = REAL_HOME / "assets"
    if not (assets / "vmlinuz").exists():
        pytest.exit(f"no guest assets in {assets}: run `make assets`", returncode=3)
    if not BINARY.exists():
        pytest.exit(f"{BINARY} missing: run `make build`", returncode=3)
    home = Path(tempfile.mkdtemp(prefix="siesta-e2b-", dir="/var/tmp"))
    (home / "assets").symlink_to(assets)
    _share_template(REAL_HOME / "repo", home / "repo", "base")
    return home


def _share_template(real: Path, repo: Path, name: str) -> None:
    """Puts template `name` of the real repository into the test home's, so
    the session does not build it again. Its blobs are immutable and
    content-addressed, so they are hard-linked (copied across file systems);
    the snapshot directory is copied: the real template may be rebuilt or
    deleted while we run, and a paused sandbox must find what it was born
    from. Without a real template, `_build_template` builds one."""
    alias = real / "aliases" / f"template:{name}"
    if not alias.is_file():
        return
    snap_id = alias.read_text().strip()
    source = real / "snapshots" / snap_id
    record = json.loads((source / "record.json").read_text())
    for sub in ("aliases", "blobs", "snapshots"):
        (repo / sub).mkdir(parents=True, exist_ok=True)
    for f in record["files"].values():
        if f["in"] != "blob":
            continue
        src, dst = real / "blobs" / f["sha256"], repo / "blobs" / f["sha256"]
        try:
            os.link(src, dst)
        except OSError:
            subprocess.run(["cp", "--sparse=always", str(src), str(dst)], check=True)
    subprocess.run(["cp", "-a", str(source), str(repo / "snapshots" / snap_id)], check=True)
    (repo / "aliases" / f"template:{name}").write_text(snap_id)


def _build_template(home: Path, log: Path) -> None:
    env = dict(os.environ, SIESTA_HOME=str(home))
    with open(log, "ab") as out:
        out.write(b"=== siesta template build base --if-missing ===\n")
        out.flush()
        done = subprocess.run(
            [str(BINARY), "template", "build", "base", "--if-missing"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=900,
            check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.exit(f"building the base template failed:\n{tail}", returncode=3)


@pytest.fixture(scope="session")
def siesta(tmp_path_factory):
    home = _prepare_home()
    log = tmp_path_factory.mktemp("logs") / "siesta.log"
    server = SiestaServer(BINARY, home, log)
    leftovers: list[str] = []
    try:
        _build_template(home, log)
        server.start()
        os.environ.pop("E2B_DEBUG", None)
        os.environ["E2B_API_URL"] = server.url
        os.environ["E2B_SANDBOX_URL"] = server.url
        os.environ["E2B_VOLUME_API_URL"] = server.url
        os.environ["E2B_API_KEY"] = server.api_key()
        yield server
    finally:
        server.stop()
        for pid in pids_using(home):  # VMMs a crashed server left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        leftovers = netns_of(server.tag)
        for ns in leftovers:
            subprocess.run(["ip", "netns", "delete", ns], check=False)
        print(f"\nsiesta log: {log}\n{server.log_tail(30)}")
        if os.environ.get("SIESTA_E2B_KEEP") != "1":
            shutil.rmtree(home, ignore_errors=True)
    assert not leftovers, f"network namespaces left by the server: {leftovers}"


@pytest.fixture(scope="session")
def api(siesta):
    """An httpx client for raw control-API calls, with the API key."""
    import httpx

    with httpx.Client(
        base_url=siesta.url,
        headers={"X-API-KEY": siesta.api_key()},
        timeout=30,
    ) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def sbx(siesta):
    """One running sandbox shared by a module's tests, killed at its end."""
    from e2b import Sandbox

    box = Sandbox.create(template="base", timeout=600, metadata={"suite": "e2b"})
    try:
        yield box
    finally:
        try:
            Sandbox.kill(box.sandbox_id)
        except Exception as e:  # report, but let the test results stand
            print(f"killing {box.sandbox_id}: {e}")
