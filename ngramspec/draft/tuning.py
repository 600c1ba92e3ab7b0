"""How much to draft outside one session's own sizing: the cost model of a fixed curve (a
session started without a speculator, ``verify_cost=...``), and the one draft length a
padded batch verifies (the rule of :mod:`ngramspec.draft.sizing`, padded).
"""

from __future__ import annotations

import numpy as np

from ..cost.costmodel import OnlineCost
from ..cost.curves import DEFAULT_CPU_CURVE, CostPrior
from .config import SpeculatorConfig
from .proposal import Draft
from .sizing import padded_lengths


def fixed_cost_model(config: SpeculatorConfig) -> OnlineCost:
    """The cost model of a fixed curve, which timings never move: ``verify_cost``, or where it
    is None the CPU curve at 400 tokens of context (a session started without a speculator)."""
    return OnlineCost(CostPrior.fixed(config.verify_cost or DEFAULT_CPU_CURVE.points), learn=False,
                      tuning=config.cost_tuning)


def batch_draft_length(drafts: list[Draft], cost=None, explore_below: float | None = None) -> int:
    """One draft length K for a batch verified in one forward of shape (rows, K + 1): the
    sizing rule, padded (:func:`ngramspec.draft.sizing.draft_lengths`), with ``cost(n)`` the cost of
    one forward over n tokens of these rows relative to their plain step. Every row pays for
    K + 1 positions whatever its own draft, so on a device already busy with a large batch no
    K pays (0: a plain batched step) until rows show long, reliable matches. ``explore_below``
    (``draft_tuning.explore_below``, given where a plain step's timing is missing): a marginal
    K, under that many expected tokens per row and unit cost, gives way to a plain step that
    measures it, since the gain is uncertain while the relative costs are the prior's. ``cost=None`` (payoff
    sizing off): the longest draft of any row."""
    rows = len(drafts)
    limits = np.array([len(d) for d in drafts], dtype=np.int64)
    longest = int(limits.max(initial=0))
    if rows == 0 or longest == 0 or cost is None:  # cost None: no sizing, draft all there is
        return longest
    acceptance = np.zeros((rows, longest))  # (rows, K): positions without an estimate count as 0
    for b, d in enumerate(drafts):
        estimates = np.asarray(d.acceptance, dtype=np.float64)
        if estimates.ndim == 0:  # one rate for every position
            acceptance[b, : len(d)] = estimates
        else:
            estimates = estimates[: len(d)]
            acceptance[b, : estimates.shape[0]] = estimates
    step_costs = np.array([cost(rows * (k + 1)) for k in range(longest + 1)], dtype=np.float64)
    lengths, value = padded_lengths(acceptance, limits, step_costs)
    if explore_below is not None and value < explore_below * rows:
        return 0
    return int(lengths.max())
