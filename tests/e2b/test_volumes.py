"""Volumes (issue 17) through the official SDK's `Volume` class against a
real server: the control API (create, list, get, connect, destroy) and the
volume content API at E2B_VOLUME_API_URL, with no sandbox running.

E2B's own tests of the volume file operations
(../shared/conformance/.../volume_sync/test_file.py) run here unchanged
against this server: in E2B's suite they run against an in-memory mock.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from e2b import Volume
from e2b.exceptions import VolumeException, VolumeNotFoundException

from conftest import BINARY, unique

E2B_FILE_TESTS = (
    Path(__file__).resolve().parents[2].parent
    / "shared/conformance/e2b-python-sdk/tests/sync/volume_sync/test_file.py"
)


def _e2b_file_tests():
    if not E2B_FILE_TESTS.exists():
        raise RuntimeError(f"E2B's volume tests are missing: {E2B_FILE_TESTS}")
    spec = importlib.util.spec_from_file_location("e2b_volume_file_tests", E2B_FILE_TESTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_suite = _e2b_file_tests()
# Collected as tests of this module, so they get this module's `volume`.
TestWriteFileAndReadFile = _suite.TestWriteFileAndReadFile
TestGetInfo = _suite.TestGetInfo
TestUpdateMetadata = _suite.TestUpdateMetadata
TestMakeDir = _suite.TestMakeDir
TestList = _suite.TestList
TestRemove = _suite.TestRemove
TestFileOperationsLifecycle = _suite.TestFileOperationsLifecycle


@pytest.fixture
def volume(siesta):
    """A fresh volume on the real server, destroyed after the test."""
    vol = Volume.create(unique("vol"))
    try:
        yield vol
    finally:
        Volume.destroy(vol.volume_id)


def test_create_list_get_connect_destroy(siesta):
    name = unique("data")
    vol = Volume.create(name)
    try:
        assert vol.name == name and vol.volume_id.startswith("vol-") and vol.token
        listed = {v.volume_id: v.name for v in Volume.list()}
        assert listed.get(vol.volume_id) == name
        info = Volume.get_info(vol.volume_id)
        assert (info.name, info.token) == (name, vol.token)
        with pytest.raises(VolumeException) as err:
            Volume.create(name)
        assert "already exists" in str(err.value)
        vol.write_file("/kept.txt", "kept")
        again = Volume.connect(vol.volume_id)
        assert again.read_file("/kept.txt") == "kept"
    finally:
        assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id)
    assert vol.volume_id not in {v.volume_id for v in Volume.list()}


def test_bad_names_are_refused_with_the_reason(siesta):
    for bad in ["", "has space", "-dash", "x" * 65]:
        with pytest.raises(VolumeException) as err:
            Volume.create(bad)
        assert "invalid volume name" in str(err.value), bad


def test_a_large_file_streams_both_ways(volume):
    data = os.urandom(5 << 20)
    stat = volume.write_file("/big.bin", data)
    assert stat.size == len(data) and stat.uid == 1000 and stat.mode == 0o644
    got = b"".join(volume.read_file("/big.bin", format="stream"))
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()


def test_the_token_is_the_volumes_own(siesta, volume):
    other = Volume.create(unique("other"))
    try:
        volume.write_file("/private.txt", "mine")
        url = f"{siesta.url}/volumecontent/{volume.volume_id}/file"
        params = {"path": "/private.txt"}
        assert httpx.get(url, params=params).status_code == 401
        wrong = {"Authorization": f"Bearer {other.token}"}
        assert httpx.get(url, params=params, headers=wrong).status_code == 401
        api_key = {"X-API-KEY": siesta.api_key()}
        assert httpx.get(url, params=params, headers=api_key).status_code == 401
        right = {"Authorization": f"Bearer {volume.token}"}
        assert httpx.get(url, params=params, headers=right).text == "mine"
        # No name oracle: a volume that does not exist answers as a wrong
        # token does.
        for name in [unique("nosuch"), "vol-0000000000000000"]:
            missing = f"{siesta.url}/volumecontent/{name}/file"
            r = httpx.get(missing, params=params, headers=right)
            assert r.status_code == 401, r.text
            assert r.json()["message"] == httpx.get(url, params=params, headers=wrong).json()["message"]
    finally:
        Volume.destroy(other.volume_id)


def test_paths_cannot_leave_the_volume(siesta, volume):
    auth = {"Authorization": f"Bearer {volume.token}"}
    base = f"{siesta.url}/volumecontent/{volume.volume_id}"
    for path in ["../etc/passwd", "/a/../../etc", ".."]:
        r = httpx.get(f"{base}/path", params={"path": path}, headers=auth)
        assert r.status_code == 400, (path, r.text)
        assert "`..` is not allowed" in r.json()["message"]
    r = httpx.delete(f"{base}/path", params={"path": "/"}, headers=auth)
    assert r.status_code == 400 and "delete the volume instead" in r.json()["message"]


def test_a_volume_holds_no_more_than_its_limit(siesta, api):
    r = api.post("/volumes", json={"name": unique("small"), "sizeLimitMB": 1})
    assert r.status_code == 201, r.text
    vol = Volume.connect(r.json()["volumeID"])
    try:
        vol.write_file("/a.bin", b"x" * (900 << 10))
        with pytest.raises(VolumeException) as err:
            vol.write_file("/b.bin", b"y" * (200 << 10))
        assert "is full" in str(err.value)
        assert not vol.exists("/b.bin")
        assert [e.name for e in vol.list("/")] == ["a.bin"]
    finally:
        Volume.destroy(vol.volume_id)
    r = api.post("/volumes", json={"name": unique("x"), "size": 5})
    assert r.status_code == 400 and "unknown field" in r.json()["message"]


def test_volumes_outlive_a_server_restart(siesta):
    vol = Volume.create(unique("durable"))
    try:
        vol.make_dir("/d/e", force=True)
        vol.write_file("/d/e/f.txt", "survives")
        siesta.stop()
        siesta.start()
        again = Volume.connect(vol.volume_id)
        assert again.token == vol.token
        assert again.read_file("/d/e/f.txt") == "survives"
    finally:
        Volume.destroy(vol.volume_id)


def test_the_cli_creates_copies_lists_and_removes(siesta, tmp_path):
    env = dict(os.environ, SIESTA_URL=siesta.url, SIESTA_API_KEY=siesta.api_key())

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BINARY), "volume", *args], env=env, capture_output=True, text=True, timeout=60
        )

    def ok(*args: str) -> str:
        out = cli(*args)
        assert out.returncode == 0, f"siesta volume {' '.join(args)}: {out.stderr}"
        return out.stdout

    name = unique("cli")
    vol_id = ok("create", name, "--size-mib", "8").strip()
    assert vol_id.startswith("vol-")
    try:
        listed = json.loads(ok("list", "--json"))
        mine = [v for v in listed if v["volumeID"] == vol_id]
        assert mine and mine[0]["name"] == name and mine[0]["sizeLimitMB"] == 8
        local = tmp_path / "in.bin"
        local.write_bytes(os.urandom(100_000))
        ok("cp", str(local), f"{name}:/in.bin")
        again = cli("cp", str(local), f"{name}:/in.bin")
        assert again.returncode != 0 and "already exists" in again.stderr
        ok("cp", "--force", str(local), f"{name}:/in.bin")
        ok("cp", f"{name}:/in.bin", str(tmp_path / "out.bin"))
        assert (tmp_path / "out.bin").read_bytes() == local.read_bytes()
        entries = json.loads(ok("ls", name, "/", "--json"))
        assert [(e["name"], e["size"]) for e in entries] == [("in.bin", 100_000)]
        assert "in.bin" in ok("ls", name)
        missing = cli("cp", f"{name}:/nope", str(tmp_path / "nope"))
        assert missing.returncode != 0 and "not found" in missing.stderr
        assert not (tmp_path / "nope").exists()
    finally:
        ok("rm", name)
    gone = cli("rm", name)
    assert gone.returncode != 0 and "not found" in gone.stderr
