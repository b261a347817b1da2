"""Filesystem-only pause and snapshot and reboot on resume (issue 17),
through the official SDK on real VMs: `pause(keep_memory=False)`, a timeout
with `lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}}`,
`create_snapshot(mode="filesystem")` and `connect(on_resume="reboot")`.
The disk is kept, processes are not, and the resume is a cold boot,
reported as the `cold_boot` stage."""

from __future__ import annotations

import time

from e2b import Sandbox, SandboxState, Volume

from conftest import unique


def boot_id(sbx: Sandbox) -> str:
    return sbx.files.read("/proc/sys/kernel/random/boot_id").strip()


def stages(api, sandbox_id: str) -> list[str]:
    """The stages of the sandbox's last resume, by name."""
    detail = api.get(f"/sandboxes/{sandbox_id}").json()
    return [name for name, _ms in (detail.get("timings") or {}).get("stages") or []]


def test_a_filesystem_only_pause_keeps_files_not_processes(api):
    vol = Volume.create(unique("fsvol"))
    sbx = Sandbox.create("base", timeout=300, volume_mounts={"/mnt/v": vol})
    try:
        sbx.files.write("/home/user/kept.txt", "on the disk")
        # Written and not synced by the guest: the pause syncs it.
        sbx.commands.run("echo unsynced > /home/user/unsynced.txt")
        sbx.commands.run("sleep 3600", background=True)
        before = boot_id(sbx)

        assert sbx.pause(keep_memory=False)
        assert not sbx.is_running()
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED

        resumed = sbx.connect()
        assert resumed.sandbox_id == sbx.sandbox_id
        assert resumed.files.read("/home/user/kept.txt") == "on the disk"
        assert resumed.files.read("/home/user/unsynced.txt") == "unsynced\n"
        assert boot_id(resumed) != before, "a cold boot has a new boot id"
        assert resumed.commands.run("pgrep -x sleep || true").stdout.strip() == ""
        assert "cold_boot" in stages(api, sbx.sandbox_id)
        # The volume is mounted again by the fresh guest.
        resumed.files.write("/mnt/v/after-reboot.txt", "mounted")
        assert vol.read_file("/after-reboot.txt") == "mounted"

        # A full pause of the cold-booted sandbox keeps its processes again.
        resumed.commands.run("sleep 3600", background=True)
        resumed.pause()
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("pgrep -x sleep").stdout.strip() != ""
        assert boot_id(again) == boot_id(resumed)
    finally:
        Sandbox.kill(sbx.sandbox_id)
        Volume.destroy(vol.volume_id)


def test_a_timeout_pause_can_keep_the_disk_only(api):
    sbx = Sandbox.create(
        "base",
        timeout=3,
        lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}},
    )
    try:
        sbx.files.write("/home/user/marker.txt", "auto")
        before = boot_id(sbx)
        assert api.get(f"/sandboxes/{sbx.sandbox_id}").json()["pauseMode"] == "filesystem"
        deadline = time.time() + 60
        while Sandbox.get_info(sbx.sandbox_id).state != SandboxState.PAUSED:
            assert time.time() < deadline, "the timeout did not pause it"
            time.sleep(1)
        assert not sbx.is_running()
        resumed = sbx.connect()
        assert resumed.files.read("/home/user/marker.txt") == "auto"
        assert boot_id(resumed) != before
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_connect_can_reboot_a_paused_sandbox(api):
    sbx = Sandbox.create("base", timeout=300)
    try:
        sbx.commands.run("echo synced > /home/user/synced.txt && sync")
        sbx.commands.run("sleep 3600", background=True)
        before = boot_id(sbx)
        sbx.pause()
        rebooted = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")
        assert rebooted.files.read("/home/user/synced.txt") == "synced\n"
        assert boot_id(rebooted) != before
        assert rebooted.commands.run("pgrep -x sleep || true").stdout.strip() == ""
        assert "cold_boot" in stages(api, sbx.sandbox_id)
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_strict_pause_of_a_healthy_guest_goes_ahead(api):
    sbx = Sandbox.create("base", timeout=300)
    try:
        r = api.post(f"/sandboxes/{sbx.sandbox_id}/pause", json={"requireHealthyGuest": True})
        assert r.status_code == 204, r.text
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        r = api.post(f"/sandboxes/{sbx.sandbox_id}/pause", json={"requireHealthyGuest": True})
        assert r.status_code in (404, 409), r.text
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_sandboxes_from_a_filesystem_only_snapshot_cold_boot(api):
    source = Sandbox.create("base", timeout=300)
    made = [source]
    try:
        source.commands.run("echo from-source > /home/user/snap.txt")
        source.commands.run("sleep 3600", background=True)
        snap = source.create_snapshot(mode="filesystem")
        # The source runs on, processes and all.
        assert source.commands.run("pgrep -x sleep").stdout.strip() != ""
        child = Sandbox.create(snap.snapshot_id, timeout=300)
        made.append(child)
        assert child.files.read("/home/user/snap.txt") == "from-source\n"
        assert boot_id(child) != boot_id(source)
        assert child.commands.run("pgrep -x sleep || true").stdout.strip() == ""
        assert "cold_boot" in stages(api, child.sandbox_id)
    finally:
        for s in made:
            Sandbox.kill(s.sandbox_id)
