"""From inside a real guest: the node's memory and disk stay bounded.

One sandbox with a volume mounted. Its guest, as `user` or root:
- sends the NFS export hostile records: a 2 GiB record mark on two
  connections at once, and a call whose AUTH_UNIX gid count is 0xffffffff
  (before, 4 bytes cost the server 2 GiB and a gid count 16 GiB); the
  server's peak resident memory (VmHWM) must grow by less than 64 MiB and
  the mount keep working;
- plants a setuid-root file through the mount: on the host it arrives
  without the bit and not owned by root;
- makes directories until the volume says no: the loop stops at the
  volume's limit (every entry costs 4 KiB of it);
- writes 6 MiB to its serial port (TCG's UART is slow: about 0.1 MiB/s):
  the console logs on the host stay under 5.5 MiB, the cap (4 MiB) plus
  the kept tail (1 MiB) and what one check interval lets through.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from e2b import Sandbox

HOSTILE_NFS = r'''
import socket, struct
def conn():
    return socket.create_connection(("169.254.0.22", 2049), timeout=10)
# 1. A 2 GiB record mark, on two connections at once: closed, nothing held.
held = [conn(), conn()]
for s in held:
    s.sendall(b"\x7f\xff\xff\xff")
closed = sum(1 for s in held if s.recv(16) == b"")
# 2. One call whose AUTH_UNIX gid list claims 0xffffffff entries.
words = [0x5151, 0, 2, 100003, 3, 0, 1, 20, 0, 0, 0, 0, 0xffffffff, 0, 0]
body = b"".join(struct.pack(">I", w) for w in words)
s = conn()
s.sendall(struct.pack(">I", 0x80000000 | len(body)) + body)
reply = s.recv(64)
print("closed", closed, "reply", len(reply))
'''

VOLUME_MIB = 1


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _reset_peak(pid: int) -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS.
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _serial_logs(siesta, sandbox_id: str) -> list[Path]:
    found = []
    for log in siesta.home.rglob("serial.log*"):
        # The run directory of a running sandbox names it.
        if sandbox_id in str(log):
            found.append(log)
    return found


def test_a_guest_cannot_exhaust_the_node(siesta, attack):
    server_pid = siesta.proc.pid
    name = f"esc-{uuid.uuid4().hex[:8]}"
    r = siesta.api("POST", "/volumes", json={"name": name, "sizeLimitMB": VOLUME_MIB})
    assert r.status_code in (200, 201), r.text
    vol_id = r.json()["volumeID"]
    sbx = Sandbox.create("base", timeout=300, volume_mounts={"/mnt/v": name})
    try:
        assert sbx.commands.run("echo ok > /mnt/v/before && cat /mnt/v/before").stdout == "ok\n"
        _reset_peak(server_pid)
        before = _vm_hwm_kib(server_pid)
        sbx.files.write("/tmp/hostile_nfs.py", HOSTILE_NFS)
        out = sbx.commands.run("python3 /tmp/hostile_nfs.py", timeout=120).stdout
        grew_mib = (_vm_hwm_kib(server_pid) - before) / 1024
        print(f"hostile NFS: {out.strip()}; server peak grew {grew_mib:.1f} MiB")
        attack("NFS record mark of 2 GiB on two connections", grew_mib >= 64)
        attack("NFS call with 0xffffffff AUTH_UNIX gids", grew_mib >= 64)
        assert grew_mib < 64, f"the server's peak memory grew {grew_mib:.0f} MiB"
        assert "closed 2" in out, out
        # The mount still works.
        assert sbx.commands.run("echo after > /mnt/v/after && cat /mnt/v/after").stdout == "after\n"

        # A setuid-root file planted through the mount.
        sbx.commands.run("cp /bin/true /mnt/v/x && sudo chown 0:0 /mnt/v/x && sudo chmod 4755 /mnt/v/x")
        planted = [p for p in siesta.home.rglob("x") if "volumes" in p.parts and p.parent.name == "data"]
        assert planted, "the planted file is not on the host"
        st = planted[0].stat()
        attack("setuid-root file planted through NFS", bool(st.st_mode & 0o6000) or st.st_uid == 0)
        assert not st.st_mode & 0o6000 and st.st_uid != 0, (oct(st.st_mode), st.st_uid)

        # Directories until the volume is full.
        made = sbx.commands.run(
            "i=0; while [ $i -lt 5000 ] && mkdir /mnt/v/d$i 2>/dev/null; do i=$((i+1)); done; echo $i",
            timeout=300,
        ).stdout.strip()
        attack("a mkdir loop past the volume's limit", int(made) >= 5000)
        assert int(made) < 5000, f"made {made} directories in a {VOLUME_MIB} MiB volume"

        # The serial console flooded.
        sbx.commands.run(
            "sudo sh -c 'head -c 6M /dev/zero | tr \"\\0\" x > /dev/ttyS0'", timeout=600
        )
        logs = _serial_logs(siesta, sbx.sandbox_id)
        assert logs, "no console log found for the sandbox"
        total = sum(p.stat().st_size for p in logs)
        print(f"console logs after 6 MiB to the UART: {total / 2**20:.1f} MiB in {len(logs)} files")
        attack("6 MiB written to the serial console", total > 11 << 19)
        assert total <= 11 << 19, f"console logs hold {total} bytes"
        assert sbx.commands.run("echo alive").stdout.strip() == "alive"
    finally:
        sbx.kill()
        siesta.api("DELETE", f"/volumes/{vol_id}")
