"""The control API as the SDK drives it: create, get_info, list with
filters and paging, set_timeout, kill."""

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState

from conftest import unique


@pytest.fixture(scope="module")
def pair(siesta):
    """Two sandboxes that share a unique metadata value; the second is paused."""
    tag = unique("list")
    boxes = [
        Sandbox.create(template="base", timeout=600, metadata={"listtag": tag, "n": str(i)})
        for i in range(2)
    ]
    try:
        assert boxes[1].pause() is True
        yield tag, boxes
    finally:
        for b in boxes:
            Sandbox.kill(b.sandbox_id)


def test_create_and_get_info(sbx):
    assert sbx.sandbox_id
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.template_id == "base"
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {"suite": "e2b"}
    assert info.cpu_count >= 1 and info.memory_mb >= 128
    assert info.end_at > info.started_at
    assert sbx.is_running() is True


def ids(paginator_items):
    return {s.sandbox_id for s in paginator_items}


def all_items(paginator):
    items = []
    while paginator.has_next:
        items += paginator.next_items()
    return items


def test_list_state_filter(pair):
    tag, (running, paused) = pair
    q = SandboxQuery(metadata={"listtag": tag}, state=[SandboxState.RUNNING])
    assert ids(all_items(Sandbox.list(query=q))) == {running.sandbox_id}
    q = SandboxQuery(metadata={"listtag": tag}, state=[SandboxState.PAUSED])
    listed = all_items(Sandbox.list(query=q))
    assert ids(listed) == {paused.sandbox_id}
    assert listed[0].state == SandboxState.PAUSED
    # No state: both.
    q = SandboxQuery(metadata={"listtag": tag})
    assert ids(all_items(Sandbox.list(query=q))) == {running.sandbox_id, paused.sandbox_id}


def test_list_metadata_filter(pair, sbx):
    tag, (running, paused) = pair
    q = SandboxQuery(metadata={"listtag": tag, "n": "0"})
    assert ids(all_items(Sandbox.list(query=q))) == {running.sandbox_id}
    q = SandboxQuery(metadata={"listtag": "no-such-value"})
    assert all_items(Sandbox.list(query=q)) == []
    # Values with spaces and symbols survive the SDK's double encoding.
    assert sbx.sandbox_id in ids(
        all_items(Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b"})))
    )


def test_list_paging(pair):
    tag, boxes = pair
    pages = Sandbox.list(query=SandboxQuery(metadata={"listtag": tag}), limit=1)
    first = pages.next_items()
    assert len(first) == 1
    assert pages.has_next
    second = pages.next_items()
    assert len(second) == 1
    assert ids(first) != ids(second)
    assert ids(first) | ids(second) == {b.sandbox_id for b in boxes}
    # A third page, if the server had to offer one, is empty.
    if pages.has_next:
        assert pages.next_items() == []
    assert not pages.has_next


def test_set_timeout(sbx):
    before = sbx.get_info().end_at
    sbx.set_timeout(3000)
    after = sbx.get_info().end_at
    assert after > before
    sbx.set_timeout(600)
    assert sbx.get_info().end_at < after


def test_kill_true_then_false(siesta):
    box = Sandbox.create(template="base", timeout=120)
    assert box.kill() is True
    assert Sandbox.kill(box.sandbox_id) is False


def test_metrics_keep_their_time_range(sbx):
    import datetime

    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=2)
    now = sbx.get_metrics()
    assert len(now) == 1 and now[0].mem_total > 0, now
    ranged = sbx.get_metrics(start=start, end=datetime.datetime.now(datetime.timezone.utc))
    assert ranged, "a range that ends now holds the samples taken in it"
    for m in ranged:
        assert m.timestamp >= start.replace(microsecond=0)
    before = sbx.get_metrics(
        start=start - datetime.timedelta(hours=1), end=start - datetime.timedelta(minutes=30)
    )
    assert before == [], "nothing was sampled before the sandbox existed"


def test_console_logs_show_what_the_guest_wrote(api, sbx):
    """`GET /sandboxes/{id}/logs` (v1) and `/v2/.../logs`: the console."""
    marker = unique("console-marker")
    sbx.commands.run(f"echo {marker} > /dev/ttyS0", user="root")
    v1 = api.get(f"/sandboxes/{sbx.sandbox_id}/logs")
    assert v1.status_code == 200, v1.text
    assert any(marker in e["line"] for e in v1.json()["logs"]), v1.text[-2000:]
    v2 = api.get(f"/v2/sandboxes/{sbx.sandbox_id}/logs", params={"limit": 5})
    assert v2.status_code == 200, v2.text
    entries = v2.json()["logs"]
    assert 1 <= len(entries) <= 5
    assert any(marker in e["message"] for e in entries), entries
    assert api.get(f"/sandboxes/{sbx.sandbox_id}/logs", params={"limit": 0}).status_code == 400


def test_refresh_extends_a_running_sandbox_only(api, siesta):
    box = Sandbox.create(template="base", timeout=60)
    try:
        before = Sandbox.get_info(box.sandbox_id).end_at
        r = api.post(f"/sandboxes/{box.sandbox_id}/refreshes", json={"duration": 900})
        assert r.status_code == 204, r.text
        after = Sandbox.get_info(box.sandbox_id).end_at
        assert (after - before).total_seconds() > 600, (before, after)
        # A later deadline is kept: a shorter refresh does not cut it.
        assert api.post(f"/sandboxes/{box.sandbox_id}/refreshes", json={"duration": 10}).status_code == 204
        assert Sandbox.get_info(box.sandbox_id).end_at == after
        assert api.post(f"/sandboxes/{box.sandbox_id}/refreshes", json={"duration": 4000}).status_code == 400
        assert box.pause() is True
        assert api.post(f"/sandboxes/{box.sandbox_id}/refreshes", json={}).status_code == 409
    finally:
        Sandbox.kill(box.sandbox_id)


def test_metrics_of_several_sandboxes_at_once(api, sbx, pair):
    """`GET /sandboxes/metrics?sandbox_ids=`: the latest sample of each
    (taken now for running ones); unknown ids are left out."""
    _, (running, paused) = pair
    ids = ",".join([sbx.sandbox_id, running.sandbox_id, paused.sandbox_id, "nope"])
    r = api.get("/sandboxes/metrics", params={"sandbox_ids": ids})
    assert r.status_code == 200, r.text
    got = r.json()["sandboxes"]
    assert {sbx.sandbox_id, running.sandbox_id} <= set(got) and "nope" not in got
    assert all(m["memTotal"] > 0 and m["cpuCount"] >= 1 for m in got.values())
    assert api.get("/sandboxes/metrics").status_code == 400
