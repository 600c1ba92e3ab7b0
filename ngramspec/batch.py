"""The batched speculative decode loop: every row drafts, all rows are verified in ONE forward,
and each row keeps its own number of draft tokens.

The loop sees the target model through three callables (``hf.py`` builds them):

    forward(ids, positions, mask, keep) -> logits   ids, positions: (A, q) for the A rows still
                                                    decoding; mask: (A, C + q) over the C cache
                                                    columns and then the q new ones;
                                                    returns float logits (A, keep, V)
    crop(m)                                         drop the last m cache columns of all rows
    gather(rows, columns)                           keep cache rows ``rows`` (A',) and, in each,
                                                    the columns ``columns`` (A', C') (row-wise)

Cache layout. Rows share one cache of C columns, but each accepts a different number of draft
tokens per step. So a row's rejected draft tokens stay in the cache as *holes*, masked out in
``mask`` (A, C), and positions are given explicitly (a row's next position is the number of
real tokens it has), so holes never shift a position: each row computes exactly what it would
compute alone. The columns no row accepted are cropped; when holes (and left padding) make up
most of the cache, ``gather`` compacts every row to its valid columns. Rows that finish leave
the batch (their cache rows are dropped), so the rest do not pay for them.

Invariant between steps, per row: the cache holds every token of the row except the last one,
which the next forward feeds (with the row's draft behind it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import decode
from .decode import StopRule, TokenBuffer, agreement, to_device
from .metrics import DecodeStats
from .speculator import batch_draft_length


@dataclass
class BatchResult:
    sequences: torch.Tensor  # (B, P + longest new) left-padded prompts + new tokens, pad-filled
    stats: list[DecodeStats]  # one per row
    scores: list = field(default_factory=list)  # (B, V) per new-token index, if kept
    logits: list = field(default_factory=list)  # (B, V) per new-token index, if kept


def speculative_batch(
    prompt: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    prompt_positions: torch.Tensor,
    sessions: list,
    forward: Callable,
    crop: Callable[[int], None],
    gather: Callable[[torch.Tensor, torch.Tensor | None], None],
    stop: StopRule,
    pad_token_id: int,
    forward_cost: Callable[[int], float] | None,
    process: list | None = None,
    keep_scores: bool = False,
    keep_logits: bool = False,
    sample: bool = False,
) -> BatchResult:
    """Decode the left-padded batch ``prompt`` (B, P) (``prompt_mask`` (B, P), None when there is
    no padding; ``prompt_positions`` (B, P)), row b drafting from ``sessions[b]``. Each row's
    tokens are exactly those plain decoding of the batch gives that row (greedy), or a draw from
    exactly the same distribution (``sample=True``); see ``decode.speculative_greedy`` for the
    sample-and-compare rule. ``process[b](prefix (1, n), logits (1, V))`` (or None) processes
    row b's logits given its left-padded prefix, as plain batched decoding presents it.
    ``forward_cost(n)`` is the relative cost of one forward over n tokens; it sets the draft
    length shared by the batch (:func:`~ngramspec.speculator.batch_draft_length`); None drafts
    the longest proposal.
    """
    wall_start = time.perf_counter()
    device = prompt.device
    batch, prompt_len = prompt.shape
    stats = [DecodeStats(prompt_tokens=int(prompt_mask[b].sum()) if prompt_mask is not None else prompt_len)
             for b in range(batch)]
    new_tokens: list[list[int]] = [[] for _ in range(batch)]
    seq = TokenBuffer(prompt, reserve=min(max(stop.max_length - prompt_len, 1), 4096) + 64)
    kept_scores = [[] for _ in range(batch)]
    kept_logits = [[] for _ in range(batch)]

    def processed(b: int, prefix_len: int, logits_row: torch.Tensor) -> torch.Tensor:
        # logits_row: (1, V) float32 for row b after seq[b, :prefix_len] -> scores (1, V).
        processor = process[b] if process is not None else None
        return logits_row if processor is None else processor(seq.data[b : b + 1, :prefix_len], logits_row)

    def keep(b: int, scores_row: torch.Tensor, logits_row: torch.Tensor) -> None:
        # What is asked, per emitted token of row b: scores (V,) and logits (V,).
        if keep_scores:
            kept_scores[b].append(scores_row)
        if keep_logits:
            kept_logits[b].append(logits_row)

    def pick(scores: torch.Tensor) -> list[int]:
        # scores: (N, V) -> the greedy or sampled token of every row, in one host-device sync.
        if sample:
            return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)[:, 0].tolist()
        return scores.argmax(-1).tolist()

    fast_greedy = not (keep_scores or keep_logits or sample) and (process is None or not any(process))

    # Prefill: one forward over the padded prompts gives each row's first new token.
    mask = prompt_mask.long() if prompt_mask is not None else torch.ones_like(prompt)  # (B, C)
    logits = forward(prompt, prompt_positions, mask, 1)  # (B, 1, V)
    first = [processed(b, prompt_len, logits[b, -1:]) for b in range(batch)]
    emitted = [[token] for token in pick(torch.cat(first))]
    for b in range(batch):
        keep(b, first[b][0], logits[b, -1])
    valid = [s.prompt_tokens for s in stats]  # per cache row: columns holding a real token
    for s in stats:
        s.record_prefill()
    next_position = prompt_positions[:, -1] + 1  # (B,) position of each row's last emitted token
    active = list(range(batch))  # cache row a holds batch row active[a]
    drafts = [None] * batch
    verified = [None] * batch
    wall_drafter = [0.0] * batch

    while True:
        # Record what the last step emitted; rows that stop leave the batch.
        still = []
        for a, b in enumerate(active):
            start = prompt_len + len(new_tokens[b])
            seq.write(start, emitted[b], row=b)
            kept, stats[b].stop_reason = stop.first_stop(seq.data[b : b + 1], start, emitted[b])
            t0 = time.perf_counter()
            sessions[b].extend(emitted[b][:kept], verified=verified[b])
            wall_drafter[b] += time.perf_counter() - t0
            new_tokens[b].extend(emitted[b][:kept])
            if not stats[b].stop_reason:
                still.append(a)
        if not still:
            break
        if len(still) < len(active):
            rows = to_device(still, device)
            gather(rows, None)
            mask, next_position = mask[rows], next_position[rows]
            valid = [valid[a] for a in still]
            active = [active[a] for a in still]

        # 1. Propose: each row drafts from its own text; one length K is chosen for the batch.
        t0 = time.perf_counter()
        for b in active:
            budget = stop.max_length - (prompt_len + len(new_tokens[b])) - 1
            drafts[b] = sessions[b].propose(max_tokens=budget, sized=False, tree=False)
        width = batch_draft_length([drafts[b] for b in active], forward_cost)
        draft_tokens = {b: drafts[b].tokens[:width].tolist() for b in active}
        spent = (time.perf_counter() - t0) / len(active)
        for b in active:
            wall_drafter[b] += spent
            verified[b] = len(draft_tokens[b])
            seq.write(prompt_len + len(new_tokens[b]), draft_tokens[b], row=b)

        # 2. One forward over [last, d1..dK] per row: ids (A, K+1), filler after short drafts.
        # Built on the host, then moved in one copy each (the index and drafts live on the host).
        rows_n = len(active)
        ids = torch.full((rows_n, width + 1), pad_token_id, dtype=torch.long)
        step_mask = torch.zeros((rows_n, width + 1), dtype=mask.dtype)
        for a, b in enumerate(active):
            k = len(draft_tokens[b])
            ids[a, 0] = new_tokens[b][-1]
            ids[a, 1 : k + 1] = torch.tensor(draft_tokens[b], dtype=torch.long)
            step_mask[a, : k + 1] = 1  # filler positions are never attended to
        ids, step_mask = to_device(ids, device), to_device(step_mask, device, mask.dtype)
        positions = next_position[:, None] + torch.arange(width + 1, device=device)  # (A, K+1)
        logits = forward(ids, positions, torch.cat([mask, step_mask], dim=1), width + 1)  # (A, K+1, V)

        # 3. Verify each row: keep draft tokens while they equal the target's own choice.
        # Position j of a row only matters if its d1..dj were accepted; on an accelerator every
        # position is processed with that prefix and all rows' choices are read in one sync, on
        # CPU each row is decided position by position up to its first rejection.
        at_once = fast_greedy or decode.reads_all_positions_at_once(logits)
        if fast_greedy:
            targets = logits.argmax(-1).tolist()  # (A, K+1)
        elif at_once:
            spans, scores = [], []  # rows of `scores` belonging to each active row
            for a, b in enumerate(active):
                base, k = prompt_len + len(new_tokens[b]), len(draft_tokens[b])
                spans.append(len(scores))
                scores.extend(processed(b, base + j, logits[a, j : j + 1]) for j in range(k + 1))
            scores = torch.cat(scores)  # (sum of k+1, V)
            flat = pick(scores)
        accepted = []
        for a, b in enumerate(active):
            draft, k = draft_tokens[b], len(draft_tokens[b])
            if at_once:
                row = targets[a] if fast_greedy else flat[spans[a] : spans[a] + k + 1]
                n = agreement(draft, row)
                emitted[b] = draft[:n] + [row[n]]
                if keep_scores or keep_logits:
                    for j in range(n + 1):
                        keep(b, scores[spans[a] + j], logits[a, j])  # never on the fast path
            else:
                emitted[b] = []
                base = prompt_len + len(new_tokens[b])
                for j in range(k + 1):
                    row_scores = processed(b, base + j, logits[a, j : j + 1])
                    keep(b, row_scores[0], logits[a, j])
                    emitted[b].append(pick(row_scores)[0])
                    if j == k or draft[j] != emitted[b][-1]:
                        break
                n = len(emitted[b]) - 1
            accepted.append(n)
            valid[a] += n + 1
            # 5. Record stats (the emitted tokens are written and checked at the loop's top).
            stats[b].record_step(k, n, declined=k == 0 and drafts[b].source_start >= 0)

        # 4. Accept: each row keeps [last, d1..dn] of the new columns; the rest become holes,
        # and the columns past the longest acceptance are cropped for every row.
        keep_cols = max(accepted) + 1
        accepted_t = to_device(accepted, device)
        step_mask[:, :keep_cols] = (torch.arange(keep_cols, device=device) <= accepted_t[:, None]).to(mask.dtype)
        crop(width + 1 - keep_cols)
        mask = torch.cat([mask, step_mask[:, :keep_cols]], dim=1)
        next_position = next_position + accepted_t + 1
        mask = _maybe_compact(mask, valid, gather)

    # Assemble: rows end at different lengths; the rest is padding, as plain generate() pads
    # rows that finished early.
    longest = max(len(t) for t in new_tokens)
    sequences = torch.full((batch, prompt_len + longest), pad_token_id, dtype=torch.long, device=device)
    sequences[:, :prompt_len] = prompt
    for b in range(batch):
        sequences[b, prompt_len : prompt_len + len(new_tokens[b])] = torch.as_tensor(new_tokens[b], device=device)
        stats[b].new_tokens = len(new_tokens[b])
        stats[b].drafter_seconds = wall_drafter[b]
    result = BatchResult(sequences, stats)
    if keep_scores:
        result.scores = stack_per_index(kept_scores, new_tokens, longest, pad_token_id)
    if keep_logits:
        result.logits = stack_per_index(kept_logits, new_tokens, longest, pad_token_id)
    wall = time.perf_counter() - wall_start
    for s in stats:
        s.wall_seconds = wall
    return result


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


def stack_per_index(per_row: list, new_tokens: list, longest: int, pad_token_id: int) -> list:
    """Per-row score lists -> one (B, V) tensor per new-token index. Rows that had finished get a
    point mass on the pad token they are filled with (0 there, -inf elsewhere)."""
    template = next(r[0] for r in per_row if r)
    finished = torch.full_like(template, float("-inf"))
    finished[pad_token_id] = 0.0
    return [
        torch.stack([row[i] if i < len(tokens) else finished for row, tokens in zip(per_row, new_tokens)])
        for i in range(longest)
    ]
