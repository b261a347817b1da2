"""The operations the server is killed during, each with what it needs
first and what must hold after the restart: the operation completed, or it
left no trace, and nothing that was paused before is lost."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from e2b import Sandbox, Template, Volume
from helpers import (
    Marked,
    check_marked,
    create,
    mark,
    remove_tagged,
    resume_and_check,
    state,
    tagged,
)


@dataclass
class Ctx:
    tag: str
    sbx: Sandbox | None = None
    marked: Marked | None = None
    extra: dict = field(default_factory=dict)


class Op:
    name = ""

    def prepare(self, node, tag: str) -> Ctx:
        return Ctx(tag)

    def run(self, ctx: Ctx) -> None:
        raise NotImplementedError

    def verify(self, node, ctx: Ctx, completed: bool) -> None:
        """`completed`: the call returned before the server died."""
        raise NotImplementedError

    def cleanup(self, node, ctx: Ctx) -> None:
        remove_tagged(node, ctx.tag)


def _running(node, tag: str) -> Ctx:
    sbx = create(tag)
    return Ctx(tag, sbx, mark(sbx))


def _paused(node, tag: str) -> Ctx:
    ctx = _running(node, tag)
    assert ctx.sbx.pause() is True
    return ctx


def _settled(node, m: Marked, allowed: set[str]) -> str:
    """The sandbox's state is one of `allowed`; a paused one resumes with
    both of its tokens."""
    s = state(node, m.sandbox_id)
    assert s in allowed, f"{m.sandbox_id} is {s}, expected one of {sorted(allowed)}"
    if s == "paused":
        resume_and_check(node, m)
    return s


class CreateOp(Op):
    name = "create"

    def run(self, ctx):
        create(ctx.tag)

    def verify(self, node, ctx, completed):
        found = tagged(node, ctx.tag)
        # A sandbox running when the server died is reported dead.
        assert len(found) == (1 if completed else len(found)) and len(found) <= 1, found
        for s in found:
            assert s["state"] == "dead", s


class PauseOp(Op):
    name = "pause"
    prepare = staticmethod(_running)

    def run(self, ctx):
        ctx.sbx.pause()

    def verify(self, node, ctx, completed):
        _settled(node, ctx.marked, {"paused"} if completed else {"paused", "dead"})


class ResumeOp(Op):
    name = "resume"
    prepare = staticmethod(_paused)

    def run(self, ctx):
        Sandbox.connect(ctx.marked.sandbox_id, timeout=900)

    def verify(self, node, ctx, completed):
        # Resumed before the crash: running then, so dead now.
        _settled(node, ctx.marked, {"dead"} if completed else {"paused", "dead"})


class SnapshotOp(Op):
    name = "snapshot"
    prepare = staticmethod(_running)

    def run(self, ctx):
        ctx.sbx.create_snapshot()

    def verify(self, node, ctx, completed):
        _settled(node, ctx.marked, {"dead"})
        r = node.api("GET", f"/snapshots?sandboxID={ctx.marked.sandbox_id}")
        assert r.status_code == 200, r.text
        snaps = [s["snapshotID"] for s in r.json()]
        assert len(snaps) == (1 if completed else len(snaps)) and len(snaps) <= 1, snaps
        for snap in snaps:
            child = Sandbox.create(snap, timeout=900, metadata={"fault": ctx.tag})
            check_marked(child, ctx.marked)
            ctx.extra.setdefault("snapshots", []).append(snap)

    def cleanup(self, node, ctx):
        super().cleanup(node, ctx)
        for snap in ctx.extra.get("snapshots", []):
            r = node.api("DELETE", f"/templates/{snap}")
            assert r.status_code in (204, 404), r.text


class ForkOp(Op):
    name = "fork"
    prepare = staticmethod(_running)

    def run(self, ctx):
        ctx.sbx.fork(count=2, timeout=900)

    def verify(self, node, ctx, completed):
        found = tagged(node, ctx.tag)
        assert len(found) == (3 if completed else len(found)) and len(found) <= 3, found
        _settled(node, ctx.marked, {"dead"})
        for s in found:
            assert s["state"] == "dead", s


class KillOp(Op):
    name = "kill"
    prepare = staticmethod(_paused)

    def run(self, ctx):
        Sandbox.kill(ctx.marked.sandbox_id)

    def verify(self, node, ctx, completed):
        _settled(node, ctx.marked, {"gone"} if completed else {"gone", "paused"})


class TemplateOp(Op):
    """A template build through the E2B SDK: a RUN step on `base`."""

    name = "template"

    def prepare(self, node, tag):
        return Ctx(tag, extra={"name": f"fault-{uuid.uuid4().hex[:8]}"})

    def run(self, ctx):
        t = Template().from_template("base").run_cmd(
            f"echo {ctx.tag} > /etc/fault-built", user="root")
        Template.build(t, ctx.extra["name"])

    def verify(self, node, ctx, completed):
        name = ctx.extra["name"]
        r = node.api("GET", f"/templates/{name}")
        if completed:
            assert r.status_code == 200, r.text
        if r.status_code == 404:
            return
        # A template that exists is a complete one: a build publishes it
        # last, in one step.
        assert r.status_code == 200, r.text
        sbx = Sandbox.create(name, timeout=900, metadata={"fault": ctx.tag})
        out = sbx.commands.run("cat /etc/fault-built").stdout.strip()
        assert out == ctx.tag, out

    def cleanup(self, node, ctx):
        super().cleanup(node, ctx)
        r = node.api("DELETE", f"/templates/{ctx.extra['name']}")
        assert r.status_code in (204, 404), r.text


class VolumeOp(Op):
    """A volume made and written through the SDK, and another destroyed."""

    name = "volume"
    PAYLOAD = 2 * 1024 * 1024

    def prepare(self, node, tag):
        old = Volume.create(f"fault-old-{uuid.uuid4().hex[:8]}")
        data = os.urandom(self.PAYLOAD)
        old.write_file("/kept.bin", data)
        return Ctx(tag, extra={"old": old.volume_id, "old_data": data,
                               "new": f"fault-new-{uuid.uuid4().hex[:8]}",
                               "new_data": os.urandom(self.PAYLOAD)})

    def run(self, ctx):
        vol = Volume.create(ctx.extra["new"])
        vol.write_file("/written.bin", ctx.extra["new_data"])
        Volume.destroy(ctx.extra["old"])

    def verify(self, node, ctx, completed):
        # The destroyed volume is gone, or (not destroyed yet) whole.
        old = node.api("GET", f"/volumes/{ctx.extra['old']}")
        assert old.status_code in ((404,) if completed else (200, 404)), old.text
        if old.status_code == 200:
            kept = Volume.connect(ctx.extra["old"]).read_file("/kept.bin", format="bytes")
            assert kept == ctx.extra["old_data"], "the volume not destroyed lost its file"
        # The new one exists with its whole file, or without it, or not at
        # all: never half a file, and it takes writes.
        new = node.api("GET", f"/volumes/{ctx.extra['new']}")
        assert new.status_code in ((200,) if completed else (200, 404)), new.text
        if new.status_code == 200:
            vol = Volume.connect(ctx.extra["new"])
            if completed or vol.exists("/written.bin"):
                got = vol.read_file("/written.bin", format="bytes")
                assert got == ctx.extra["new_data"], f"{len(got)} bytes of {self.PAYLOAD}"
            vol.write_file("/after.txt", "after")
            assert vol.read_file("/after.txt") == "after"

    def cleanup(self, node, ctx):
        super().cleanup(node, ctx)
        for key in ("old", "new"):
            r = node.api("DELETE", f"/volumes/{ctx.extra[key]}")
            assert r.status_code in (204, 404), r.text


OPS = {op.name: op for op in (CreateOp(), PauseOp(), ResumeOp(), SnapshotOp(), ForkOp(),
                              KillOp(), TemplateOp(), VolumeOp())}
