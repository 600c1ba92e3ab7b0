"""The speculative decode loop, independent of transformers: propose, one forward, verify,
accept and crop the cache, record stats. One prompt is a batch of one.

The loop sees the target model through a :class:`Target` (``target.py`` implements it).

Cache layout. Rows share one cache of C columns, but each accepts its own number of draft
tokens per step. So a row's rejected draft tokens stay in the cache as *holes*, masked out
in ``mask`` (A, C), and positions are given explicitly (a row's next position is the number
of real tokens it has), so holes never shift a position: each row computes exactly what it
would compute alone. The columns no row kept are cropped; a batch of one therefore never
has holes (and needs a mask only for left padding). When holes and padding make up most of
the cache, ``gather`` compacts every row to its valid columns. Rows that finish leave the
batch (their cache rows are dropped), so the rest do not pay for them.

Invariant between steps, per row: the cache holds every token of the row except the last
one, which the next forward feeds (with the row's draft behind it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..cost.timer import ForwardTimer
from ..draft.metrics import DecodeStats
from ..draft.tuning import batch_draft_length
from . import verify
from .transfer import to_device


class Target(Protocol):
    """The target model and its KV cache, as the loop uses them."""

    can_gather: bool  # False for caches that can only be cropped (static, sliding window)

    def forward(self, ids, positions, mask, keep: int, visible=None) -> torch.Tensor:
        """ids, positions: (A, q) new tokens on top of the cache; mask: (A, C + q) over the
        cache columns then the new ones (None: every column is a real token); visible: (q, q)
        bool for a token tree, True where block row i may attend to row j (None: causal).
        Returns float logits (A, keep, V) of the last ``keep`` block rows."""

    def crop(self, m: int) -> None:
        """Drop the last m cache columns of every row; once after every forward, m may be 0."""

    def gather(self, rows, columns) -> None:
        """Keep cache rows ``rows`` (A',) and/or, per row, the columns ``columns`` (A, C')."""


@dataclass(frozen=True)
class StopRule:
    """When generation ends, checked after every emitted token (so a stop inside an accepted
    draft truncates exactly there). ``extra(seq_prefix) -> bool`` covers stop strings, time
    limits and user criteria; EOS ids and the length cap are checked without it."""

    max_length: int
    eos_token_ids: frozenset = frozenset()
    extra: Callable[[torch.Tensor], bool] | None = None

    def first_stop(self, seq: torch.Tensor, start: int, tokens: list[int]) -> tuple[int, str]:
        """Number of ``tokens`` (written at ``seq[0, start:]``) to keep, and why it stopped
        ('' when no criterion fired and all are kept)."""
        for j, token in enumerate(tokens):
            length = start + j + 1
            if token in self.eos_token_ids:
                return j + 1, "eos"
            if length >= self.max_length:
                return j + 1, "max_length"
            if self.extra is not None and self.extra(seq[:, :length]):
                return j + 1, "criteria"
        return len(tokens), ""


@dataclass
class Options:
    """How to decode: what ``generate()`` asked for, in the loop's terms."""

    stop: StopRule
    pad_token_id: int = 0
    sample: bool = False
    keep_scores: bool = False
    keep_logits: bool = False
    trees: bool = False  # a batch of one may verify token trees (the target can gather)
    # forward_cost(n, context, rows): relative cost of one forward over n tokens of that many
    # rows on that many cached tokens each, relative to a plain step of those rows; for the
    # shared draft length of a batch (None: each row drafts all it proposes).
    forward_cost: Callable[[int, int, int], float] | None = None
    timer: ForwardTimer | None = None  # feeds a cost model the loop's forward timings
    # Per row, processors(prefix (1, n), logits (1, V)) -> scores (1, V), or None.
    process: list | None = None
    streamer: object = None


@dataclass
class DecodeResult:
    sequences: torch.Tensor  # (B, P + longest new): the prompts, then new tokens, pad-filled
    stats: list[DecodeStats]  # one per row
    scores: list = field(default_factory=list)  # (B, V) per new-token index, if kept
    logits: list = field(default_factory=list)  # (B, V) per new-token index, if kept


class TokenBuffer:
    """Growable (B, capacity) token buffer on the model's device: row b holds prompt[b] and
    then that row's new tokens; ``data[b, :n]`` is the row's prefix of length n."""

    def __init__(self, prompt: torch.Tensor, max_length: int):
        batch, prompt_len = prompt.shape
        reserve = min(max(max_length - prompt_len, 1), 4096) + 64  # grows on demand past this
        self.data = torch.empty((batch, prompt_len + reserve), dtype=torch.long, device=prompt.device)
        self.data[:, :prompt_len] = prompt

    def write(self, row: int, start: int, tokens) -> None:
        end = start + len(tokens)
        if end > self.data.shape[1]:
            grown = torch.empty((self.data.shape[0], 2 * end), dtype=torch.long, device=self.data.device)
            grown[:, : self.data.shape[1]] = self.data
            self.data = grown
        self.data[row, start:end] = to_device(tokens, self.data.device)


class _Rows:
    """Host-side state of the batch: per row (b) its tokens, stats and kept scores; per cache
    row (a) which batch row it holds and how many of its columns are real tokens."""

    def __init__(self, prompt, prompt_mask, sessions, options: Options):
        batch, self.prompt_len = prompt.shape
        self.seq = TokenBuffer(prompt, options.stop.max_length)
        self.sessions = sessions
        self.new: list[list[int]] = [[] for _ in range(batch)]
        self.stats = [DecodeStats(prompt_tokens=int(prompt_mask[b].sum()) if prompt_mask is not None else
                                  self.prompt_len) for b in range(batch)]
        self.scores: list[list] = [[] for _ in range(batch)]
        self.logits: list[list] = [[] for _ in range(batch)]
        self.active = list(range(batch))  # cache row a holds batch row active[a]
        self.verified: list[int | None] = [None] * batch  # draft tokens verified, when cut short
        self.proposals: list = []  # the latest Draft of each active row
        self.cut = 0  # tokens emitted past a stop in the latest take()

    def length(self, b: int) -> int:
        return self.prompt_len + len(self.new[b])

    def context(self) -> int:
        """Mean real tokens per active row: what a forward attends over."""
        return sum(self.stats[b].prompt_tokens + len(self.new[b]) for b in self.active) // len(self.active)

    def take(self, a: int, verdict: verify.Verdict, options: Options) -> bool:
        """Record what row active[a] emitted: write it, check stops, tell the drafter and the
        streamer. Returns False when the row stopped (the unkept tokens are dropped)."""
        b, start = self.active[a], self.length(self.active[a])
        self.seq.write(b, start, verdict.tokens)
        kept, self.stats[b].stop_reason = options.stop.first_stop(self.seq.data[b : b + 1], start, verdict.tokens)
        if options.streamer is not None:
            options.streamer.put(torch.tensor(verdict.tokens[:kept]))
        t0 = time.perf_counter()
        self.sessions[b].extend(verdict.tokens[:kept], verified=self.verified[b])
        self.stats[b].drafter_seconds += time.perf_counter() - t0
        self.new[b].extend(verdict.tokens[:kept])
        self.scores[b].extend(verdict.scores[:kept])
        self.logits[b].extend(verdict.logits[:kept])
        self.cut = len(verdict.tokens) - kept  # tokens past a stop (a batch of one crops them)
        return not self.stats[b].stop_reason


def speculative_decode(prompt, prompt_mask, prompt_positions, sessions: list, target: Target,
                       options: Options) -> DecodeResult:
    """Decode the left-padded batch ``prompt`` (B, P) (``prompt_mask`` (B, P), None when there
    is no padding; ``prompt_positions`` (B, P)), row b drafting from ``sessions[b]``. Greedy:
    each row gets exactly the tokens plain decoding of the batch gives it. Sampling: each row's
    tokens are a draw from exactly plain sampling's distribution (see :mod:`ngramspec.hf.verify`).
    """
    wall_start = time.perf_counter()
    batch = prompt.shape[0]
    rows = _Rows(prompt, prompt_mask, sessions, options)
    cache = _CacheLayout(prompt_mask, prompt_positions, [s.prompt_tokens for s in rows.stats])
    keep = options.keep_scores or options.keep_logits
    if options.streamer is not None:
        options.streamer.put(prompt.cpu())

    # Prefill: one forward over the padded prompts gives each row's first new token.
    logits = target.forward(prompt, prompt_positions, prompt_mask, 1)  # (B, 1, V)
    uniform = _uniform(rows, batch) if options.sample else None
    verdicts = verify.verify_step([[]] * batch, None, logits, _scorer(rows, options), uniform, keep)
    for s in rows.stats:
        s.record_prefill(time.perf_counter() - wall_start)  # the choice above read the logits: done

    still = [a for a in range(len(rows.active)) if rows.take(a, verdicts[a], options)]
    while still:
        if len(still) < len(rows.active):  # finished rows leave the batch
            cache.keep_rows(still, target)
            rows.active = [rows.active[a] for a in still]

        # 1. Propose: every row drafts from its own text (a chain, or a tree for one row).
        drafts, parents = _propose(rows, options)

        # 2. One forward over [last, *draft] per row: ids (A, q); filler after short drafts is
        # masked out. A tree's tokens sit at position last + depth and see only their ancestors.
        ids, positions, mask, visible = cache.block([rows.new[b][-1] for b in rows.active], drafts, parents)
        if options.timer is not None:
            options.timer.start()
        logits = target.forward(ids, positions, mask, ids.shape[1], visible)  # (A, q, V)
        if options.timer is not None:
            options.timer.stop(ids.numel(), rows.context(), ids.shape[0])

        # 3. Verify: each row keeps the draft tokens the target itself would have produced.
        verdicts = verify.verify_step(drafts, parents, logits, _scorer(rows, options), uniform, keep)

        # 4. Emit: write each row's tokens, check its stops, tell its drafter.
        still = [a for a in range(len(rows.active)) if rows.take(a, verdicts[a], options)]

        # 5. Accept: each row keeps [last, kept draft tokens] of the block; the other columns
        # become holes (masked), and those past the longest kept run are cropped for all rows. A
        # batch of one that stopped drops its tokens past the stop in the same crop (recurrent
        # layers roll back once per forward): the returned cache holds all tokens but the last.
        cut = rows.cut if batch == 1 and not still else 0
        cache.accept(verdicts, ids.shape[1], tree=parents is not None, target=target, compact=batch > 1, cut=cut)

        # 6. Record stats.
        for a, b in enumerate(rows.active):
            declined = not drafts[a] and rows.proposals[a].source_start >= 0
            rows.stats[b].record_step(len(drafts[a]), len(verdicts[a].path), declined=declined)

    if options.timer is not None:  # every timed forward reaches the cost model
        options.timer.finish()
    if options.streamer is not None:
        options.streamer.end()
    return _result(rows, options, time.perf_counter() - wall_start)


class _CacheLayout:
    """Host-side bookkeeping of the shared cache (see the module docstring): its number of
    columns C, per cache row the position of its last emitted token and its number of real
    columns, and the (A, C) mask of real columns on the device, None while every column is real
    (a batch of one without padding never needs one)."""

    def __init__(self, prompt_mask, prompt_positions, real_tokens: list[int]):
        self.device = prompt_positions.device
        self.mask = prompt_mask.long() if prompt_mask is not None else None
        self.columns = prompt_positions.shape[1]
        self.next_position = (prompt_positions[:, -1] + 1).tolist()  # one sync, before the prefill
        self.valid = list(real_tokens)

    def keep_rows(self, still: list[int], target: Target) -> None:
        rows = to_device(still, self.device)
        target.gather(rows, None)
        self.mask = self.mask[rows] if self.mask is not None else None
        self.next_position = [self.next_position[a] for a in still]
        self.valid = [self.valid[a] for a in still]

    def block(self, last: list[int], drafts: list[list[int]], parents):
        """Device inputs of one step: ids and positions (A, q), the mask (A, C + q) or None,
        and a tree's visibility (q, q) or None."""
        q = 1 + max(len(d) for d in drafts)
        ids = [[t] + d + [0] * (q - 1 - len(d)) for t, d in zip(last, drafts)]
        depth, visible = (list(range(q)), None) if parents is None else verify.tree_layout(parents[0])
        positions = [[p + d for d in depth] for p in self.next_position]
        short = [len(d) + 1 for d in drafts if len(d) + 1 < q]
        if short and self.mask is None:  # the first masked columns: the mask so far is all ones
            self.mask = torch.ones((len(drafts), self.columns), dtype=torch.long, device=self.device)
        mask = None
        if self.mask is not None:
            step = to_device([[1] * (len(d) + 1) + [0] * (q - 1 - len(d)) for d in drafts], self.device)
            mask = torch.cat([self.mask, step], 1)
        return to_device(ids, self.device), to_device(positions, self.device), mask, visible

    def accept(self, verdicts: list[verify.Verdict], q: int, tree: bool, target: Target, compact: bool, cut=0):
        """Keep each row's [last, kept draft tokens] of the block (A, q) just verified, less ``cut``."""
        kept = [len(v.path) for v in verdicts]
        width = max(kept) + 1  # block columns that stay: the rest is cropped for every row
        if tree and not verdicts[0].is_prefix:  # a tree branch: select its columns (one row)
            rows = verify.block_rows(verdicts[0].path)
            target.gather(None, to_device([list(range(self.columns)) + [self.columns + r for r in rows]], self.device))
        target.crop(cut if tree and not verdicts[0].is_prefix else q - width + cut)
        if self.mask is None and len(set(kept)) > 1:  # the first holes
            self.mask = torch.ones((len(kept), self.columns), dtype=torch.long, device=self.device)
        if self.mask is not None:
            step = (torch.arange(width, device=self.device) <= to_device(kept, self.device)[:, None]).long()
            self.mask = torch.cat([self.mask, step], 1)
        self.columns += width
        self.next_position = [p + n + 1 for p, n in zip(self.next_position, kept)]
        self.valid = [v + n + 1 for v, n in zip(self.valid, kept)]
        if compact and self.mask is not None:
            self.mask = _maybe_compact(self.mask, self.valid, target.gather)
            self.columns = self.mask.shape[1]


def _propose(rows: _Rows, options: Options) -> tuple[list[list[int]], list | None]:
    """Each active row's draft, and the tree parents (None: chains). A row alone sizes its own
    draft; a batch pays for its longest draft in every row, so one length is chosen for all
    (:func:`~ngramspec.draft.tuning.batch_draft_length`) and drafts are cut to it."""
    t0 = time.perf_counter()
    budgets = [options.stop.max_length - rows.length(b) - 1 for b in rows.active]  # room left, less the target's
    if len(rows.active) == 1:
        proposal = rows.sessions[rows.active[0]].propose(max_tokens=budgets[0], tree=options.trees)
        rows.proposals = [proposal]
        drafts = [proposal.tokens.tolist()]
        parents = None if proposal.parents is None else [proposal.parents.tolist()]
    else:
        rows.proposals = [rows.sessions[b].propose(max_tokens=n, sized=False, tree=False)
                          for b, n in zip(rows.active, budgets)]
        cost, context, n = options.forward_cost, rows.context(), len(rows.active)
        # Where no plain step of these rows was timed yet, a marginal draft gives way to one.
        explore = cost is not None and options.timer is not None and options.timer.cost.needs_baseline(context, n)
        explore_below = rows.sessions[rows.active[0]].config.draft_tuning.explore_below if explore else None
        width = batch_draft_length(rows.proposals, None if cost is None else lambda t: cost(t, context, n),
                                   explore_below)
        drafts = [p.tokens[:width].tolist() for p in rows.proposals]
        parents = None
    spent = (time.perf_counter() - t0) / len(rows.active)
    for a, b in enumerate(rows.active):
        rows.stats[b].drafter_seconds += spent
        rows.verified[b] = len(drafts[a]) if len(drafts[a]) < len(rows.proposals[a]) else None
        if parents is None and options.process is not None:  # processors read drafts as prefix
            rows.seq.write(b, rows.length(b), drafts[a])
    return drafts, parents


def _uniform(rows: _Rows, batch: int) -> Callable[[int, int], float]:
    """uniform(a, j): the uniform of cache row a's j-th token this step, fixed per (batch row,
    output position) so that drafts never change what is sampled (:class:`verify.Uniforms`)."""
    uniforms = verify.Uniforms(batch)

    def uniform(a: int, j: int) -> float:
        b = rows.active[a]
        return uniforms(b, len(rows.new[b]) + j)

    return uniform


def _scorer(rows: _Rows, options: Options) -> verify.Score | None:
    """Row a's processors applied with its prefix followed by the tokens the step emitted so
    far, as plain decoding presents it; None when no row has processors."""
    if options.process is None:
        return None

    def score(a: int, emitted: list[int], logits_row: torch.Tensor) -> torch.Tensor:
        b = rows.active[a]
        start = rows.length(b)
        if emitted and options.trees:  # a tree's branch tokens are not in the buffer yet
            rows.seq.write(b, start, emitted)
        processor = options.process[b]
        if processor is None:
            return logits_row
        return processor(rows.seq.data[b : b + 1, : start + len(emitted)], logits_row)

    return score


def _maybe_compact(mask: torch.Tensor, valid: list[int], gather) -> torch.Tensor:
    """When masked columns (left padding, rejected drafts) make up over a third of the cache,
    move each row's valid columns to the right end (left-padded again) and drop the rest.
    mask: (A, C) -> (A, C') with C' the most valid columns of any row; ``valid`` (A,): each
    row's valid columns, counted on the host so that deciding costs no device sync."""
    width = max(valid)
    if mask.shape[1] - width < max(32, mask.shape[1] // 3):
        return mask
    valid = to_device(valid, mask.device)  # (A,)
    # Per row: indices of valid columns, in order, right-aligned into `width` slots; the left
    # slots repeat column 0 and stay masked.
    order = torch.sort(mask * torch.arange(1, mask.shape[1] + 1, device=mask.device), dim=1, stable=True)
    columns = order.indices[:, -width:]  # (A, width): valid columns last, in increasing order
    new_mask = (torch.arange(width, device=mask.device) >= (width - valid)[:, None]).to(mask.dtype)
    columns = torch.where(new_mask.bool(), columns, torch.zeros_like(columns))
    gather(None, columns)
    return new_mask


def _result(rows: _Rows, options: Options, wall_seconds: float) -> DecodeResult:
    """Rows end at different lengths; the rest is padding, as plain generate() pads rows that
    finished early."""
    batch, prompt_len = len(rows.new), rows.prompt_len
    longest = max(len(t) for t in rows.new)
    sequences = torch.full((batch, prompt_len + longest), options.pad_token_id, dtype=torch.long,
                           device=rows.seq.data.device)
    sequences[:, :prompt_len] = rows.seq.data[:, :prompt_len]
    for b in range(batch):
        sequences[b, prompt_len : rows.length(b)] = rows.seq.data[b, prompt_len : rows.length(b)]
        rows.stats[b].new_tokens = len(rows.new[b])
        rows.stats[b].wall_seconds = wall_seconds
    result = DecodeResult(sequences, rows.stats)
    if options.keep_scores:
        result.scores = stack_per_index(rows.scores, rows.new, longest, options.pad_token_id)
    if options.keep_logits:
        result.logits = stack_per_index(rows.logits, rows.new, longest, options.pad_token_id)
    return result


def stack_per_index(per_row: list, new_tokens: list, longest: int, pad_token_id: int) -> list:
    """Per-row lists of (V,) scores -> one (B, V) tensor per new-token index. Rows that had
    finished get a point mass on the pad token they are filled with (0 there, -inf elsewhere)."""
    template = next(r[0] for r in per_row if r)
    finished = torch.full_like(template, float("-inf"))
    finished[pad_token_id] = 0.0
    return [
        torch.stack([row[i] if i < len(tokens) else finished for row, tokens in zip(per_row, new_tokens)])
        for i in range(longest)
    ]
