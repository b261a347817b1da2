"""Volumes mounted in sandboxes (issue 17), through the official SDK on
real VMs: each mount is an NFSv3 export served inside the sandbox's own
network namespace and mounted by the guest agent before create returns.

What a sandbox writes to its volume outlives it, is seen by other
sandboxes mounting the volume, survives pause and resume (and a server
restart while paused), and comes with forks and snapshot children. A
volume that is mounted cannot be deleted; bad mounts are refused."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from e2b import Sandbox, SandboxException, Volume

from conftest import unique

BIG_MIB = 50


def sha256_in(sbx: Sandbox, path: str) -> str:
    return sbx.commands.run(f"sha256sum {path} | cut -d' ' -f1").stdout.strip()


@pytest.fixture(scope="module")
def volume(siesta):
    vol = Volume.create(unique("mnt"))
    yield vol
    Volume.destroy(vol.volume_id)


@pytest.fixture(scope="module")
def written(volume):
    """A first sandbox writes a 50 MiB file and a small one to the volume,
    syncs, and is killed: the data must outlive it."""
    sbx = Sandbox.create("base", timeout=300, volume_mounts={"/mnt/data": volume})
    try:
        owner = sbx.commands.run("stat -c %U:%G /mnt/data").stdout.strip()
        assert owner == "user:user"
        mounted = sbx.commands.run("grep ' /mnt/data ' /proc/mounts").stdout
        assert " nfs " in mounted and "vers=3" in mounted, mounted
        sbx.commands.run(
            f"dd if=/dev/urandom of=/mnt/data/big.bin bs=1M count={BIG_MIB} status=none"
            " && echo 'small file' > /mnt/data/small.txt && sync",
            timeout=300,
        )
        digest = sha256_in(sbx, "/mnt/data/big.bin")
        info = Sandbox.get_info(sbx.sandbox_id)
        assert info.volume_mounts == [{"name": volume.name, "path": "/mnt/data"}]
    finally:
        Sandbox.kill(sbx.sandbox_id)
    return digest


def test_data_outlives_the_sandbox_that_wrote_it(volume, written):
    # Read on the host through the content API, no sandbox running.
    assert volume.read_file("/small.txt") == "small file\n"
    got = volume.read_file("/big.bin", format="bytes")
    assert len(got) == BIG_MIB << 20
    assert hashlib.sha256(got).hexdigest() == written
    # And from a second sandbox.
    sbx = Sandbox.create("base", timeout=300, volume_mounts={"/home/user/vol": volume.name})
    try:
        assert sha256_in(sbx, "/home/user/vol/big.bin") == written
        assert sbx.files.read("/home/user/vol/small.txt") == "small file\n"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_two_sandboxes_see_each_others_writes(volume, written):
    a = Sandbox.create("base", timeout=300, volume_mounts={"/mnt/v": volume})
    b = Sandbox.create("base", timeout=300, volume_mounts={"/mnt/v": volume})
    try:
        a.commands.run("echo from-a > /mnt/v/shared-a.txt")
        assert b.commands.run("cat /mnt/v/shared-a.txt").stdout == "from-a\n"
        b.files.write("/mnt/v/shared-b.txt", "from-b")
        assert a.files.read("/mnt/v/shared-b.txt") == "from-b"
        assert volume.read_file("/shared-b.txt") == "from-b"
    finally:
        Sandbox.kill(a.sandbox_id)
        Sandbox.kill(b.sandbox_id)


def test_pause_resume_and_a_restart_keep_the_mount(siesta, volume, written):
    sbx = Sandbox.create("base", timeout=600, volume_mounts={"/mnt/data": volume})
    try:
        sbx.files.write("/mnt/data/before-pause.txt", "kept")
        sbx.pause()
        sbx = Sandbox.connect(sbx.sandbox_id)
        assert sbx.files.read("/mnt/data/before-pause.txt") == "kept"
        sbx.files.write("/mnt/data/after-resume.txt", "written after resume")
        assert volume.read_file("/after-resume.txt") == "written after resume"

        sbx.pause()
        siesta.stop()
        siesta.start()
        sbx = Sandbox.connect(sbx.sandbox_id)
        assert sbx.files.read("/mnt/data/after-resume.txt") == "written after resume"
        assert sha256_in(sbx, "/mnt/data/big.bin") == written
        sbx.commands.run("echo after-restart > /mnt/data/after-restart.txt")
        assert volume.read_file("/after-restart.txt") == "after-restart\n"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_forks_and_snapshot_children_share_the_volume(volume, written):
    source = Sandbox.create("base", timeout=300, volume_mounts={"/mnt/data": volume})
    made = [source]
    try:
        source.files.write("/mnt/data/from-source.txt", "source")
        children = source.fork(count=1)
        child = children[0]
        assert isinstance(child, Sandbox), child
        made.append(child)
        assert child.files.read("/mnt/data/from-source.txt") == "source"
        child.files.write("/mnt/data/from-child.txt", "child")
        # Shared, not copied: the source sees the child's write.
        assert source.files.read("/mnt/data/from-child.txt") == "child"
        assert Sandbox.get_info(child.sandbox_id).volume_mounts == [
            {"name": volume.name, "path": "/mnt/data"}
        ]

        snap = source.create_snapshot()
        from_snap = Sandbox.create(snap.snapshot_id, timeout=300)
        made.append(from_snap)
        assert from_snap.files.read("/mnt/data/from-child.txt") == "child"
    finally:
        for s in made:
            Sandbox.kill(s.sandbox_id)


def test_a_mounted_volume_cannot_be_deleted(siesta, api):
    vol = Volume.create(unique("busy"))
    sbx = Sandbox.create("base", timeout=300, volume_mounts={"/mnt/busy": vol})
    try:
        r = api.delete(f"/volumes/{vol.volume_id}")
        assert r.status_code == 409, r.text
        assert sbx.sandbox_id in r.json()["message"]
        sbx.pause()
        r = api.delete(f"/volumes/{vol.volume_id}")
        assert r.status_code == 409, "a paused sandbox still mounts it"
    finally:
        Sandbox.kill(sbx.sandbox_id)
    assert Volume.destroy(vol.volume_id) is True


def test_bad_mounts_are_refused_with_the_reason(siesta, volume, api):
    with pytest.raises(SandboxException) as err:
        Sandbox.create("base", volume_mounts={"/mnt/x": unique("no-such-volume")})
    assert "not found" in str(err.value)
    for body, why in [
        ([{"name": volume.name, "path": "relative/path"}], "must be absolute"),
        ([{"name": volume.name, "path": "/mnt/../etc"}], "must be absolute"),
        (
            [{"name": volume.name, "path": "/mnt/a"}, {"name": volume.name, "path": "/mnt/a"}],
            "both mounted at",
        ),
        ([{"name": volume.name}], "missing field"),
    ]:
        r = api.post("/v2/sandboxes", json={"templateID": "base", "volumeMounts": body})
        assert r.status_code in (400, 404), (body, r.text)
        assert why in r.json()["message"], (body, r.text)


def test_exports_are_reachable_only_from_their_own_sandbox(volume, written):
    """The export of a mount listens in its sandbox's own namespace: a
    sandbox without mounts finds nothing on the NFS port, and one with a
    mount finds no second export."""
    probe = (
        "python3 -c \"import socket,sys; s=socket.socket(); s.settimeout(2);"
        " print(s.connect_ex(('169.254.0.22', int(sys.argv[1]))))\" "
    )
    plain = Sandbox.create("base", timeout=300)
    mounted = Sandbox.create("base", timeout=300, volume_mounts={"/mnt/data": volume})
    try:
        assert plain.commands.run(probe + "2049").stdout.strip() != "0"
        assert mounted.commands.run(probe + "2049").stdout.strip() == "0"
        assert mounted.commands.run(probe + "2050").stdout.strip() != "0"
    finally:
        Sandbox.kill(plain.sandbox_id)
        Sandbox.kill(mounted.sandbox_id)

