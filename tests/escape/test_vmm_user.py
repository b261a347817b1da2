"""A guest that took over its QEMU: what that process could then do.

Every VMM runs as an unprivileged user of its own (`-runas uid:gid`, no
capabilities, no passwd entry). The test finds the QEMU processes of two
running sandboxes, checks their users, and then acts as one of them (a
child process with that uid, gid and no other groups, which is all a
compromised QEMU holds besides the descriptors it was given) and tries:
reading the node's database, the other sandbox's disk and its snapshot
files, the API key's secret, writing the template's memory file, and
signalling the other sandbox's QEMU. Each must fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from e2b import Sandbox
from vmm_proc import open_files, qemu_of, status

VMM_UID_BASE = 1_900_000_000
VMM_USERS_LOCK = "/run/siesta/vmm-users.lock"


def _guest_ram_file(pid: int, home: Path) -> Path:
    """The file QEMU `pid` maps the guest's RAM from: its largest mapping of
    a file under the home (the template's memory file)."""
    best, size = None, 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith(str(home)):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if end - start > size:
            best, size = Path(fields[5]), end - start
    assert best is not None, f"QEMU {pid} maps no file under {home}"
    return best


ACT_AS = r'''
import os, sys, json
uid = int(sys.argv[1])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
results = {}
for path in sys.argv[3:]:
    mode = os.O_RDWR if path.endswith("!rw") else os.O_RDONLY
    path = path.removesuffix("!rw")
    try:
        os.close(os.open(path, mode))
        results[path] = "opened"
    except OSError as e:
        results[path] = e.strerror
try:
    os.kill(int(sys.argv[2]), 0)
    results["signal"] = "sent"
except OSError as e:
    results["signal"] = e.strerror
print(json.dumps(results))
'''


def test_a_compromised_vmm_reaches_nothing_of_the_node(siesta, attack):
    a = Sandbox.create("base", timeout=300)
    b = Sandbox.create("base", timeout=300)
    try:
        qa, qb = qemu_of(a.sandbox_id), qemu_of(b.sandbox_id)
        sa, sb = status(qa), status(qb)
        uid_a, uid_b = int(sa["Uid"].split()[0]), int(sb["Uid"].split()[0])
        for s, uid in ((sa, uid_a), (sb, uid_b)):
            assert all(int(x) == uid for x in s["Uid"].split()), s["Uid"]
            assert all(int(x) == uid for x in s["Gid"].split()), s["Gid"]
            assert s["Groups"].split() == [str(uid)], s["Groups"]
            assert s["CapEff"] == "0000000000000000" and s["CapPrm"] == "0000000000000000"
            assert s["Seccomp"] == "2"
        attack("a VMM running as root", uid_a == 0 or uid_b == 0)
        assert uid_a >= VMM_UID_BASE and uid_b >= VMM_UID_BASE, (uid_a, uid_b)
        attack("two VMMs sharing one user", uid_a == uid_b)
        assert uid_a != uid_b
        # The server holds the host-wide lock on each uid (so no other
        # siesta process of the host hands it out meanwhile); a QEMU with a
        # descriptor of it could unlock its uid, or lock every other.
        for pid in (qa, qb):
            held = Path(VMM_USERS_LOCK) in open_files(pid)
            attack("a VMM holds the host's uid lock file", held)
            assert not held, f"QEMU {pid} holds {VMM_USERS_LOCK}"
        # Each is chrooted into an empty directory: even what any user of
        # the host may read (/etc/passwd, the kernel's config) has no path.
        for pid in (qa, qb):
            root = Path(os.readlink(f"/proc/{pid}/root"))
            attack("a VMM opens a world-readable host file by path", root == Path("/"))
            assert root == Path(VMM_USERS_LOCK).with_name("vmm-root"), root
            assert not any(root.iterdir()), f"{root} is not empty"

        home = siesta.home
        b_disk = open_files(qb, ".qcow2")
        assert b_disk, f"QEMU {qb} holds no disk open"
        targets = {
            "the node's database": (home / "siesta.db", "r"),
            "the other sandbox's disk": (b_disk[0], "r"),
            "the template's memory file, for writing": (_guest_ram_file(qa, home), "rw"),
        }
        secrets = sorted(p for p in (home / "secrets").rglob("*") if p.is_file())
        if secrets:
            targets["a secret of the server"] = (secrets[0], "r")
        args = [f"{p}!rw" if mode == "rw" else str(p) for p, mode in targets.values()]
        out = subprocess.run(
            [sys.executable, "-c", ACT_AS, str(uid_a), str(qb), *args],
            capture_output=True, text=True, check=True,
        ).stdout
        results = json.loads(out)
        print(f"acting as VMM user {uid_a}: {results}")
        for what, (path, _) in targets.items():
            got = results[str(path)]
            attack(f"a VMM opens {what}", got == "opened")
            assert got == "Permission denied", (what, path, got)
        attack("a VMM signals another sandbox's VMM", results["signal"] == "sent")
        assert results["signal"] == "Operation not permitted", results
        # Both sandboxes still work.
        assert a.commands.run("echo a").stdout == "a\n"
        assert b.commands.run("echo b").stdout == "b\n"
    finally:
        a.kill()
        b.kill()
