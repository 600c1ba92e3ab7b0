"""The speculative greedy decode loop (batch of one), independent of transformers.

The loop sees the target model only through two callables (``hf.py`` builds them):

    forward(ids, start, keep, tree=None)  ids: (1, q) token ids at stream positions
                                          start..start+q-1, fed on top of the KV cache;
                                          returns float logits (keep, V) of the last `keep` rows.
                                          tree: (depth (q,), visible (q, q) bool) for a token
                                          tree: ids[i] sits at position start + depth[i] and
                                          attends to the new ids j with visible[i, j]
    crop(m)                               drop the last m entries of the KV cache
    keep_path(rows, q)                    of the last q cache entries keep only ``rows``
                                          (in order): the accepted path of a tree; None
                                          when the model's cache cannot (then no trees)

Invariant between steps: the cache holds every token of ``seq`` except the last one, which
is fed (with the draft behind it) by the next forward. So a step over [last, d1..dk] that
keeps e new tokens leaves ``k + 1 - e`` cache entries to crop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .metrics import DecodeStats


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
class DecodeResult:
    sequence: torch.Tensor  # (1, prompt + new) token ids
    stats: DecodeStats
    scores: list = field(default_factory=list)  # processed scores (1, V) per new token, if kept
    logits: list = field(default_factory=list)  # raw logits (1, V) per new token, if kept


def to_device(values, device: torch.device, dtype=torch.long) -> torch.Tensor:
    """Host values (a list, or a CPU tensor) on ``device`` without a host-device sync: on CUDA
    the values go through pinned memory and an asynchronous copy (a copy from pageable memory
    would wait for every kernel queued before it). The caching host allocator keeps the pinned
    block until the copy has run."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def agreement(draft: list[int], choices: list[int]) -> int:
    """Draft tokens a step keeps: the length of the prefix of ``draft`` equal to the target's
    ``choices`` (which hold one more entry: the choice after the last draft token)."""
    n = 0
    while n < len(draft) and draft[n] == choices[n]:
        n += 1
    return n


def reads_all_positions_at_once(logits: torch.Tensor) -> bool:
    """How a step with processors or sampling decides its draft positions. On an accelerator:
    every position processed (assuming the drafts before it accepted) and all choices read in
    one host-device sync. On CPU there is no sync to save, while processors and sampling cost
    per position (top-p sorts the vocabulary; multinomial is slow), so positions are decided
    one by one and the work stops at the first rejection."""
    return logits.device.type != "cpu"


class TokenBuffer:
    """Growable (B, capacity) token buffer on the model's device: row b holds prompt[b] and
    then that row's new tokens; ``data[b, :n]`` is the row's prefix of length n."""

    def __init__(self, prompt: torch.Tensor, reserve: int):
        batch, prompt_len = prompt.shape
        self.data = torch.empty((batch, prompt_len + reserve), dtype=torch.long, device=prompt.device)
        self.data[:, :prompt_len] = prompt

    def write(self, start: int, tokens, row: int = 0) -> None:
        end = start + len(tokens)
        if end > self.data.shape[1]:
            grown = torch.empty((self.data.shape[0], 2 * end), dtype=torch.long, device=self.data.device)
            grown[:, : self.data.shape[1]] = self.data
            self.data = grown
        self.data[row, start:end] = to_device(tokens, self.data.device)


def tree_layout(parents) -> tuple:
    """Block layout of [last, *tree]: depth (q,) (0 for the last token) and visible (q, q),
    True where block entry i may attend to entry j (j is i or one of its ancestors).
    parents[i]: the draft token that draft token i follows, -1 for the last token."""
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


def _children(draft: list[int], parents) -> dict:
    """(block row of parent - 1, token) -> draft index: -1 is the last token."""
    if parents is None:
        return {(i - 1, token): i for i, token in enumerate(draft)}
    return {(int(parent), token): i for i, (parent, token) in enumerate(zip(parents, draft))}


def speculative_greedy(
    prompt: torch.Tensor,
    session,
    forward: Callable[[torch.Tensor, int, int], torch.Tensor],
    crop: Callable[[int], None],
    stop: StopRule,
    process: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    streamer=None,
    keep_scores: bool = False,
    keep_logits: bool = False,
    sample: bool = False,
    keep_path: Callable[[list[int], int], None] | None = None,
) -> DecodeResult:
    """Decoding of ``prompt`` (1, P) with drafts from ``session``: greedy decoding returns
    exactly the tokens plain greedy decoding would produce; ``sample=True`` draws every token
    from exactly the distribution plain sampling would use.

    ``process(prefix, logits_row) -> scores`` applies logits processors (and, when sampling,
    warpers) with the prefix that ends right before the position, as plain decoding does: once
    per emitted token, or, on an accelerator, once per verified position (one sync per step).

    Sampling verifies by sample-and-compare: at draft position j, draw x ~ p_j; emit x; keep
    going only if x equals the drafted token. Each emitted token is then a draw from the
    target's distribution given the emitted prefix, so the output distribution is exactly that
    of plain sampling; a lookup draft (a point mass on d) is accepted with probability p_j(d),
    and on rejection x follows p_j with d removed and renormalised — standard speculative
    sampling for a deterministic drafter.
    """
    wall_start = time.perf_counter()
    prompt_len = prompt.shape[1]
    stats = DecodeStats(prompt_tokens=prompt_len)
    result = DecodeResult(prompt, stats)
    seq = TokenBuffer(prompt, reserve=min(max(stop.max_length - prompt_len, 1), 4096) + 64)
    if streamer is not None:
        streamer.put(prompt.cpu())

    def scores_of(prefix_len: int, logits_rows: torch.Tensor) -> torch.Tensor:
        # logits_rows: (1, V) float32 after seq[:, :prefix_len] -> processed scores (1, V).
        return logits_rows if process is None else process(seq.data[:, :prefix_len], logits_rows)

    def keep(scores: torch.Tensor, logits_row: torch.Tensor) -> None:
        # Record what is asked: scores and logits (1, V) of every emitted token, in order.
        if keep_scores:
            result.scores.append(scores)
        if keep_logits:
            result.logits.append(logits_row)

    def choose(prefix_len: int, logits_row: torch.Tensor) -> int:
        # One position's choice: the prefill, and walks position by position (trees; chains
        # with processors or sampling on CPU, see reads_all_positions_at_once).
        scores = scores_of(prefix_len, logits_row)
        keep(scores, logits_row)
        return pick(scores)[0]

    def pick(scores: torch.Tensor) -> list[int]:
        # scores: (q, V) -> the greedy or sampled token of every row, in one host-device sync.
        if sample:
            return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)[:, 0].tolist()
        return scores.argmax(-1).tolist()

    # Prefill: one forward over the prompt gives the first new token.
    first = choose(prompt_len, forward(prompt, 0, 1)[-1:])
    stats.record_prefill()
    emitted = [first]
    cur_len = prompt_len  # tokens in seq before `emitted`
    while True:
        seq.write(cur_len, emitted)
        kept, stats.stop_reason = stop.first_stop(seq.data, cur_len, emitted)
        if streamer is not None:
            streamer.put(torch.tensor(emitted[:kept]))
        t0 = time.perf_counter()
        session.extend(emitted[:kept])
        stats.drafter_seconds += time.perf_counter() - t0
        cur_len += kept
        if stats.stop_reason:
            # A stop inside the emitted tokens: drop cache entries of tokens that were cut,
            # so a returned cache again holds every token but the last.
            if kept < len(emitted):
                crop(len(emitted) - kept)
            break

        # 1. Propose: at most budget - 1 draft tokens, since the step also emits the target's own.
        t0 = time.perf_counter()
        proposal = session.propose(max_tokens=stop.max_length - cur_len - 1, tree=keep_path is not None)
        stats.drafter_seconds += time.perf_counter() - t0
        draft, parents = proposal.tokens.tolist(), proposal.parents
        k = len(draft)

        # 2. One forward over [last, *draft] (1, k+1) -> logits (k+1, V); a tree draft goes
        # with its layout (positions by depth, each token seeing only its ancestors).
        if parents is None:
            seq.write(cur_len, draft)
            logits = forward(seq.data[:, cur_len - 1 : cur_len + k], cur_len - 1, k + 1)
        else:
            ids = to_device([[emitted[-1]] + draft], seq.data.device)  # emitted[-1]: the last token
            logits = forward(ids, cur_len - 1, k + 1, tree_layout(parents))

        # 3. Verify: keep draft tokens while they equal the target's greedy (or sampled) choice.
        plain = process is None and not sample  # the choice is the argmax of the raw logits
        if parents is None and (plain or reads_all_positions_at_once(logits)):
            # Position j's choice only matters if d1..dj were all accepted, so its prefix is
            # seq + d1..dj: process every position on that assumption, pick all rows in one sync.
            if process is None:
                scores = logits  # (k+1, V)
            else:
                scores = torch.cat([scores_of(cur_len + j, logits[j : j + 1]) for j in range(k + 1)])
            targets = pick(scores)  # the step's one host-device sync
            accepted = agreement(draft, targets)
            emitted, path = draft[:accepted] + [targets[accepted]], None
            if keep_scores or keep_logits:
                for j in range(accepted + 1):
                    keep(scores[j : j + 1], logits[j : j + 1])
        else:  # walk the chain or tree position by position (a tree node's prefix is its branch)
            children = _children(draft, parents)
            targets = pick(logits) if plain else None  # no prefix needed: every row's argmax at once
            emitted, path, row = [], [], 0  # row 0: the last token; draft token i is row i + 1
            while True:
                if plain:
                    target = targets[row]
                    keep(logits[row : row + 1], logits[row : row + 1])
                else:
                    target = choose(cur_len + len(emitted), logits[row : row + 1])
                emitted.append(target)
                node = children.get((row - 1, target))
                if node is None:
                    break
                path.append(node)
                row = node + 1
                if parents is not None:  # a chain's tokens are in seq already
                    seq.write(cur_len + len(emitted) - 1, [target])
            accepted = len(path)
            if path == list(range(accepted)):
                path = None  # a prefix of the block: a crop suffices

        # 4. Accept: the cache holds [.., last, d1..dk]; keep last + the accepted tokens.
        if path is None:
            crop(k - accepted)
        else:
            keep_path([0] + [node + 1 for node in path], k + 1)
        # 5. Record stats; the new tokens are written, checked for stops and streamed above.
        stats.record_step(k, accepted, declined=k == 0 and proposal.source_start >= 0)

    if streamer is not None:
        streamer.end()
    result.sequence = seq.data[:, :cur_len].clone()
    stats.new_tokens = cur_len - prompt_len
    del result.scores[stats.new_tokens :], result.logits[stats.new_tokens :]
    stats.wall_seconds = time.perf_counter() - wall_start
    return result
