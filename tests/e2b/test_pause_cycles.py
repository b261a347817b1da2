"""Twenty pause/resume cycles through the SDK (issue 11).

Each cycle writes random data into guest RAM (tmpfs), alternating small and
large writes, and a line to a file on disk, while a process keeps a counter
only in its memory. After every resume every byte written so far is there
(checksums taken in the guest when it was written), the process has counted
on from where it was, and the state the pause stored holds at least what was
written to RAM and not much more: a pause stores the pages the guest changed
since its template, not all of its RAM.
"""

import json

from e2b import Sandbox

CYCLES = 20
SMALL_KIB, LARGE_KIB = 64, 8 * 1024
# What a pause may store beyond the data written: the pages the guest's
# kernel, agent and shell touched since the template (8-10 MiB measured).
SLACK = 48 << 20
GUEST_RAM = 512 << 20

COUNTER = (
    "n=0; trap 'echo $n > /home/user/count' USR1; "
    "while :; do n=$((n+1)); sleep 0.1; done"
)


def stored_state_bytes(home, sandbox_id: str) -> int:
    """Size of the state its paused snapshot holds, from the repository."""
    repo = home / "repo"
    snap = (repo / "aliases" / f"sandbox:{sandbox_id}").read_text().strip()
    record = json.loads((repo / "snapshots" / snap / "record.json").read_text())
    return record["files"]["state"]["size"]


def count(box, pid: int) -> int:
    box.commands.run(f"rm -f /home/user/count; kill -USR1 {pid}")
    out = box.commands.run(
        "for i in $(seq 50); do test -s /home/user/count && break; sleep 0.1; done; "
        "cat /home/user/count"
    )
    return int(out.stdout.strip())


def test_twenty_cycles_keep_every_byte_and_the_process(siesta):
    box = Sandbox.create(template="base", timeout=900)
    try:
        counter = box.commands.run(COUNTER, background=True, timeout=0)
        pid = counter.pid
        counter.disconnect()
        last = count(box, pid)
        in_ram = 0
        for cycle in range(CYCLES):
            kib = LARGE_KIB if cycle % 2 else SMALL_KIB
            box.commands.run(
                f"head -c {kib}K /dev/urandom > /dev/shm/f{cycle} && "
                f"md5sum /dev/shm/f{cycle} >> /home/user/sums && "
                f"echo cycle {cycle} >> /home/user/log && sync"
            )
            in_ram += kib << 10
            assert box.pause() is True
            stored = stored_state_bytes(siesta.home, box.sandbox_id)
            assert in_ram <= stored <= in_ram + SLACK, (cycle, in_ram, stored)
            assert stored < GUEST_RAM // 2, (cycle, stored)

            box = Sandbox.connect(box.sandbox_id)
            check = box.commands.run("md5sum -c --quiet /home/user/sums && wc -l < /home/user/log")
            assert int(check.stdout.strip()) == cycle + 1, check.stdout
            now = count(box, pid)
            assert now > last, f"cycle {cycle}: the counter went from {last} to {now}"
            last = now
    finally:
        Sandbox.kill(box.sandbox_id)
