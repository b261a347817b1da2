"""SIGKILL of `siesta serve` at seeded points during create, pause,
resume, snapshot, fork, kill and template builds (conftest.POINTS); after
each restart the operation completed or left no trace, and what was paused
resumes with its disk and memory."""

from __future__ import annotations

import pytest
from conftest import KILL_TIMING, POINTS
from helpers import kill_during, timed
from ops import OPS

# Seconds each operation took here, measured once per run without a kill.
_durations: dict[str, float] = {}


def _duration(node, op) -> float:
    if op.name not in _durations:
        ctx = op.prepare(node, f"calibrate-{op.name}")
        try:
            _durations[op.name] = timed(lambda: op.run(ctx))
        finally:
            op.cleanup(node, ctx)
    return _durations[op.name]


@pytest.mark.parametrize("point", POINTS, ids=[p.id for p in POINTS])
def test_kill_point(node, point):
    op = OPS[point.op]
    delay = point.fraction * _duration(node, op)
    ctx = op.prepare(node, point.id)

    raised = kill_during(node, lambda: op.run(ctx), delay)
    KILL_TIMING.setdefault(op.name, [0, 0])[0 if raised else 1] += 1
    node.start()
    try:
        op.verify(node, ctx, completed=raised is None)
    finally:
        op.cleanup(node, ctx)
