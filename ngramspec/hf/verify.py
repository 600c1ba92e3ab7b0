"""One verify step: which draft tokens the target keeps, and what a step emits.

A step feeds [last, d1..dk] (block rows 0..k) to the target and reads its choice at every row.
Draft token i sits at block row i + 1. Walking from row 0, the target's choice at a row is
emitted; if a draft token equal to that choice follows the row, the walk moves to that token's
row, else it stops. Greedy decoding therefore emits exactly what plain greedy decoding would:

    draft   d = [5, 7, 9]            (a chain: parents -1, 0, 1)
    choices     [5, 7, 2, 4]         (argmax at rows 0..3)
    emitted     [5, 7, 2]            (d1, d2 kept; 2 is the target's own token after d2)
    path        [0, 1]               (draft indices kept)

With a token tree, ``parents[i]`` is the draft index token i follows (-1: the last token), and
the walk follows whichever child carries the choice. Sampling walks the same way with each
choice drawn from the (processed) distribution at its row, given the prefix emitted so far
(sample-and-compare): every emitted token is a draw from the target's distribution, so the
output has exactly plain sampling's distribution; a draft token d is kept with probability
p(d), and on rejection the drawn token follows p with d removed and renormalised.

Each draw inverts the distribution's CDF at a uniform fixed in advance for that (row, output
position) (:class:`Uniforms`). The uniform of a position never depends on the drafts, so a
seeded run emits the same tokens whatever was drafted: the output is the one ngramspec's
sampling gives without any draft, and ``torch.manual_seed`` makes it reproducible although
draft lengths follow measured forward times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..draft.walk import follow
from .transfer import to_device


def tree_layout(parents) -> tuple[list[int], list[list[bool]]]:
    """Block layout of [last, *tree]: depth (q,) (0 for the last token) and visible (q, q),
    True where block row i may attend to row j (j is i or one of its ancestors)."""
    q = len(parents) + 1
    depth = [0] * q
    visible = [[False] * q for _ in range(q)]
    visible[0][0] = True
    for i, parent in enumerate(parents):
        row, up = i + 1, int(parent) + 1
        depth[row] = depth[up] + 1
        visible[row] = list(visible[up])
        visible[row][row] = True
    return depth, visible


def reads_all_positions_at_once(logits: torch.Tensor) -> bool:
    """How a step with processors or sampling decides its draft positions. On an accelerator:
    every position processed (assuming the drafts before it accepted) and all choices read in
    one host-device sync. On CPU there is no sync to save, while processors and sampling cost
    per position (top-p sorts the vocabulary; each draw is a softmax and a search), so positions are decided
    one by one and the work stops at the first rejection."""
    return logits.device.type != "cpu"


class Uniforms:
    """One uniform in [0, 1) per (row, output position), drawn in order from a per-row stream
    seeded once from torch's global generator: ``uniforms(b, t)`` is the same number whenever
    and however often position t of row b is decided."""

    def __init__(self, rows: int):
        seeds = torch.randint(0, 2**62, (rows,)).tolist()  # the one draw from the global RNG
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.drawn: list[list[float]] = [[] for _ in range(rows)]

    def __call__(self, b: int, t: int) -> float:
        drawn = self.drawn[b]
        while len(drawn) <= t:
            drawn.extend(torch.rand(64, generator=self.generators[b], dtype=torch.float64).tolist())
        return drawn[t]


def pick(scores: torch.Tensor, uniforms: list[float] | None) -> list[int]:
    """scores (N, V) -> every row's token, in one host-device sync: the argmax (``uniforms``
    None), else the inverse CDF of softmax(scores) at ``uniforms`` (N,). In float64, so that
    u * total < total and a zero-probability token is never picked. The uniforms go to the
    device asynchronously (a blocking upload would be a second sync); the read is the one."""
    if uniforms is None:
        return scores.argmax(-1).tolist()
    cdf = torch.softmax(scores.double(), dim=-1).cumsum(-1)  # (N, V)
    at = cdf[:, -1:] * to_device(uniforms, cdf.device, torch.float64)[:, None]  # (N, 1)
    return torch.searchsorted(cdf, at, right=True)[:, 0].clamp(max=cdf.shape[1] - 1).tolist()


def row_prefixes(draft, parents) -> list[list[int]]:
    """Per block row (0..k) of [last, *draft], the tokens a step has emitted when the walk of
    :func:`follow` reaches that row: none at row 0, and at draft token i's row the draft tokens
    from the root down to i (a chain: ``draft[:i + 1]``). parents: None for a chain."""
    prefixes: list[list[int]] = [[]]
    for i, token in enumerate(draft):
        parent = i - 1 if parents is None else int(parents[i])
        prefixes.append(prefixes[parent + 1] + [int(token)])
    return prefixes


@dataclass
class Verdict:
    """What one row's verify step decided."""

    tokens: list[int]  # emitted: the kept draft tokens, then the target's own
    path: list[int]  # draft indices kept, in order (a chain: 0..n-1)
    scores: list = field(default_factory=list)  # processed scores (V,) per emitted token, if kept
    logits: list = field(default_factory=list)  # raw logits (V,) per emitted token, if kept

    @property
    def is_prefix(self) -> bool:
        """The kept tokens are the first rows of the block: dropping the rest is a crop."""
        return self.path == list(range(len(self.path)))


Score = Callable[[int, list[int], torch.Tensor], torch.Tensor]


def verify_step(
    drafts: list[list[int]],
    parents: list | None,
    logits: torch.Tensor,
    score: Score | None = None,
    uniform: Callable[[int, int], float] | None = None,
    keep: bool = False,
) -> list[Verdict]:
    """Verify every row's draft against one forward's ``logits`` (A, q, V) (row a's block is
    [last, *drafts[a]], padded to q). ``parents``: per row, None for chains.
    ``score(a, emitted, logits_row (1, V)) -> scores (1, V)`` applies row a's processors given
    its prefix followed by ``emitted``; None: the raw logits decide. ``uniform(a, j)``: the
    uniform that samples row a's j-th token of this step; None: greedy. ``keep``: record the
    scores and raw logits of every emitted token.

    Three ways, one rule (:func:`follow`): without processors or sampling, every row's argmax
    is read in one sync; with them, on an accelerator (chains and trees), every position is
    processed assuming the draft tokens on its way were kept and all choices are read in one
    sync; on CPU each row is decided position by position up to its first rejection.
    """
    rows = range(len(drafts))
    parents = parents if parents is not None else [None] * len(drafts)
    if score is None and uniform is None:
        choices = logits.argmax(-1).tolist()  # (A, q): the step's one host-device sync
        verdicts = [Verdict(*follow(drafts[a], parents[a], lambda row, _, a=a: choices[a][row])) for a in rows]
        if keep:
            for a, v in enumerate(verdicts):
                v.scores = v.logits = [logits[a, row] for row in block_rows(v.path)]
        return verdicts
    score = score or (lambda a, emitted, logits_row: logits_row)
    if reads_all_positions_at_once(logits):
        # A row only matters if the draft tokens on the way to it were kept: process it on that
        # assumption (its prefix: row_prefixes), and pick every row of every draft at once.
        prefixes = [row_prefixes(drafts[a], parents[a]) for a in rows]
        spans = [[score(a, prefix, logits[a, row : row + 1]) for row, prefix in enumerate(prefixes[a])] for a in rows]
        flat = pick(torch.cat([s for span in spans for s in span]),  # (sum of rows, V)
                    None if uniform is None else [uniform(a, len(p)) for a in rows for p in prefixes[a]])
        choices, start = [], 0
        for span in spans:
            choices.append(flat[start : start + len(span)])
            start += len(span)
        verdicts = [Verdict(*follow(drafts[a], parents[a], lambda row, _, a=a: choices[a][row])) for a in rows]
        if keep:
            for a, v in enumerate(verdicts):
                v.scores = [spans[a][row][0] for row in block_rows(v.path)]
                v.logits = [logits[a, row] for row in block_rows(v.path)]
        return verdicts
    verdicts = []
    for a in rows:
        kept_scores: list = []

        def choose(row: int, emitted: list[int], a: int = a, kept_scores: list = kept_scores) -> int:
            scores = score(a, emitted, logits[a, row : row + 1])
            kept_scores.append((scores[0], logits[a, row]))
            return pick(scores, None if uniform is None else [uniform(a, len(emitted))])[0]

        verdict = Verdict(*follow(drafts[a], parents[a], choose))
        if keep:
            verdict.scores = [s for s, _ in kept_scores]
            verdict.logits = [raw for _, raw in kept_scores]
        verdicts.append(verdict)
    return verdicts


def block_rows(path: list[int]) -> list[int]:
    """Block rows whose choice was emitted along ``path``: row 0, then each kept token's row."""
    return [0] + [i + 1 for i in path]
