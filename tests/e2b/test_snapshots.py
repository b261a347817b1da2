"""Snapshots and forks of a running sandbox. The endpoints exist: any error
from them fails the test (no expected failures)."""

import pytest
from e2b import Sandbox


@pytest.fixture(scope="module")
def source(siesta):
    box = Sandbox.create(template="base", timeout=600)
    try:
        box.files.write("/home/user/origin.txt", "from-the-source")
        yield box
    finally:
        Sandbox.kill(box.sandbox_id)


def test_snapshot_and_start_from_it(source):
    snap = source.create_snapshot()
    assert snap.snapshot_id
    # The source keeps running.
    assert source.commands.run("cat /home/user/origin.txt").stdout == "from-the-source"
    child = Sandbox.create(template=snap.snapshot_id, timeout=300)
    try:
        assert child.sandbox_id != source.sandbox_id
        assert child.files.read("/home/user/origin.txt") == "from-the-source"
        # The child's files are its own.
        child.files.write("/home/user/origin.txt", "changed-in-child")
        assert source.files.read("/home/user/origin.txt") == "from-the-source"
    finally:
        child.kill()
    listed = [s.snapshot_id for s in _all(Sandbox.list_snapshots(sandbox_id=source.sandbox_id))]
    assert snap.snapshot_id in listed
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False


def _all(paginator):
    items = []
    while paginator.has_next:
        items += paginator.next_items()
    return items


def test_fork(source):
    # More children than one at a time: they resume concurrently.
    forks = source.fork(count=4, timeout=300)
    try:
        assert len(forks) == 4
        for f in forks:
            assert not isinstance(f, Exception), f
            assert f.sandbox_id != source.sandbox_id
            assert f.files.read("/home/user/origin.txt") == "from-the-source"
        assert len({f.sandbox_id for f in forks}) == 4
        # Each child's kernel was reseeded at /init: random numbers drawn
        # after the fork differ although every child resumed one state.
        uuids = {f.commands.run("cat /proc/sys/kernel/random/uuid").stdout for f in forks}
        assert len(uuids) == 4
        forks[0].files.write("/home/user/origin.txt", "fork-0")
        for f in forks[1:]:
            assert f.files.read("/home/user/origin.txt") == "from-the-source"
        assert source.commands.run("echo alive").stdout == "alive\n"
    finally:
        for f in forks:
            if not isinstance(f, Exception):
                f.kill()
