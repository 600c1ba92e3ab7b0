"""Offline simulator: replay a drafter over a recorded greedy trace, without the model.

Greedy output does not depend on the drafts, so for a trace (prompt ids, greedy output ids)
the verify step is a longest-common-prefix between the draft and the recorded continuation.
Replaying gives exactly the forwards a real run would need, in milliseconds, and, with a
forward-cost curve, an estimate of the wall-clock speed-up. Same loop as ``hf/decode.py``:
prefill emits the first token; each step proposes at most ``remaining - 1`` tokens, verifies,
and emits the accepted tokens plus the target's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..cost.curves import STEEP_CPU_CURVE, CostCurve
from .metrics import DecodeStats
from .walk import accepted_length

# Replay's cost curve is the library's one (a CostCurve). ForwardCost is its former name, kept
# for callers; with no curve given, replay scores on the steep CPU curve.
ForwardCost = CostCurve


@dataclass
class ReplayResult:
    stats: DecodeStats
    cost: float  # total forward cost, in one-token forwards

    @property
    def speedup(self) -> float:
        """Cost-weighted speed-up over plain decoding (one forward per token)."""
        return self.stats.new_tokens / self.cost if self.cost else 0.0


def replay(session, output_ids, cost: CostCurve | None = None) -> ReplayResult:
    """Drive ``session`` (from ``speculator.start(prompt_ids)``) over ``output_ids``; ``cost``
    prices each verify forward (default: :data:`~ngramspec.cost.curves.STEEP_CPU_CURVE`)."""
    cost = cost or STEEP_CPU_CURVE
    output = np.asarray(output_ids, dtype=np.int32)
    stats = DecodeStats(new_tokens=len(output))
    total_cost = 0.0
    if len(output) == 0:
        return ReplayResult(stats, 0.0)
    stats.record_prefill()  # prefill emits output[0]
    total_cost += 1.0
    session.extend(output[:1])
    pos = 1
    while pos < len(output):
        t0 = time.perf_counter()
        draft = session.propose(max_tokens=len(output) - pos - 1)
        stats.drafter_seconds += time.perf_counter() - t0
        k = len(draft)
        accepted = accepted_length(draft.tokens, draft.parents, output[pos : pos + k])
        stats.record_step(k, accepted)
        total_cost += cost(k + 1)
        emitted = accepted + 1
        t0 = time.perf_counter()
        session.extend(output[pos : pos + emitted])
        stats.drafter_seconds += time.perf_counter() - t0
        pos += emitted
    finish = getattr(session, "finish", None)
    if finish is not None:
        finish()
    return ReplayResult(stats, total_cost)
