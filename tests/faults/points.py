"""The seeded list of kill points: which operation the server is killed
during, and when. A point's `fraction` is a share of that operation's
duration as measured in the same run (a little past 1.0 kills just after
it answered), so the list means the same on a fast or a slow machine, and
the same seed gives the same list."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

# How many points each operation gets in a run (default 112 in all).
COUNTS = {
    "create": 18,
    "pause": 20,
    "resume": 18,
    "snapshot": 14,
    "fork": 12,
    "kill": 12,
    "template": 10,
    "volume": 8,
}


@dataclass(frozen=True)
class KillPoint:
    index: int
    op: str
    fraction: float

    @property
    def id(self) -> str:
        return f"{self.index:03d}-{self.op}-{self.fraction:.2f}"


def seed() -> int:
    """SIESTA_FAULT_SEED, else a fresh one (printed, so a run can be
    repeated with it)."""
    value = os.environ.get("SIESTA_FAULT_SEED")
    if value is None:
        value = str(random.SystemRandom().randrange(1 << 31))
        os.environ["SIESTA_FAULT_SEED"] = value
    return int(value)


def kill_points(seed: int, scale: float = 1.0) -> list[KillPoint]:
    """The run's points in a seeded order; `scale` (SIESTA_FAULT_SCALE)
    multiplies every count (at least one each)."""
    rng = random.Random(seed)
    drawn = [
        (op, round(rng.uniform(0.0, 1.15), 2))
        for op, n in COUNTS.items()
        for _ in range(max(1, round(n * scale)))
    ]
    rng.shuffle(drawn)
    return [KillPoint(i, op, f) for i, (op, f) in enumerate(drawn)]
