"""Offline simulator: replay a drafter over a recorded greedy trace, without the model.

Greedy output does not depend on the drafts, so for a trace (prompt ids, greedy output ids)
the verify step is a longest-common-prefix between the draft and the recorded continuation.
Replaying gives exactly the forwards a real run would need, in milliseconds, and, with a
forward-cost curve, an estimate of the wall-clock speed-up. Same loop as ``decode.py``:
prefill emits the first token; each step proposes at most ``remaining - 1`` tokens, verifies,
and emits the accepted tokens plus the target's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .metrics import DecodeStats

# Relative cost of one forward over q tokens vs one token: default model, torch 2 threads,
# idle 2-core CPU, 400-1500 tokens of context (GUIDE.md section 4); linear in between.
CPU_COST_POINTS = ((1, 1.0), (2, 1.1), (3, 1.17), (4, 1.6), (8, 1.94), (11, 2.3), (16, 2.45), (32, 2.9))


@dataclass(frozen=True)
class ForwardCost:
    """Piecewise-linear cost of verifying q tokens, relative to a one-token forward."""

    points: tuple = CPU_COST_POINTS

    def __call__(self, q: int) -> float:
        qs, costs = zip(*self.points)
        return float(np.interp(q, qs, costs))


@dataclass
class ReplayResult:
    stats: DecodeStats
    cost: float  # total forward cost, in one-token forwards

    @property
    def speedup(self) -> float:
        """Cost-weighted speed-up over plain decoding (one forward per token)."""
        return self.stats.new_tokens / self.cost if self.cost else 0.0


def replay(session, output_ids, cost: ForwardCost | None = None) -> ReplayResult:
    """Drive ``session`` (from ``speculator.start(prompt_ids)``) over ``output_ids``."""
    cost = cost or ForwardCost()
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


def accepted_length(tokens: np.ndarray, parents, target: np.ndarray) -> int:
    """Draft tokens a greedy verifier keeps when the target continues with ``target``: the
    longest prefix of a chain, or the deepest path of a tree (``parents[i]``: the node token i
    follows, -1 for the root) whose tokens equal ``target`` from the start."""
    if parents is None:
        n = min(len(tokens), len(target))
        mismatch = np.flatnonzero(tokens[:n] != target[:n])
        return int(mismatch[0]) if mismatch.size else n
    node, depth = -1, 0
    while depth < len(target):
        children = np.flatnonzero((parents == node) & (tokens == target[depth]))
        if not children.size:
            break
        node, depth = int(children[0]), depth + 1
    return depth
