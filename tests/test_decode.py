"""The decode loop with a fake target (no transformers): the cache bookkeeping (crops, holes,
masks, positions, compaction, rows leaving, tree paths) must give exactly plain decoding.

The fake keeps a real per-row cache of (token, position) entries and computes each next token
from the tokens a new position can see (cache entries its mask allows, then the block entries
before it or, for a tree, its ancestors), in position order. It checks that every position the
loop passes equals the number of tokens that position sees. A mis-crop, a wrong hole, a wrong
position or a wrong tree path changes what it sees, and so the tokens.
"""

import numpy as np
import pytest
import torch

from ngramspec import NgramSpeculator
from ngramspec.hf.decode import Options, StopRule, _maybe_compact, speculative_decode

from conftest import assert_accepted

V = 16
EOS = 1
FLAT = ((1, 1.0), (512, 1.0))  # every draft pays: long drafts, many rejections


def next_token(seq: list[int]) -> int:
    """A 'model' that mostly copies (period 7) and every 5th position writes something new."""
    if len(seq) % 5 == 0 or len(seq) < 7:
        return (3 * seq[-1] + len(seq)) % (V - 2) + 2  # never EOS
    return seq[-7]


class FakeTarget:
    def __init__(self, batch: int, can_gather: bool = True):
        self.cache = [[] for _ in range(batch)]  # per row: [(token, position), ...]
        self.can_gather = can_gather
        self.gathers = []

    def forward(self, ids, positions, mask, keep, visible=None):
        rows, q = ids.shape
        logits = torch.zeros((rows, q, V))
        for a in range(rows):
            past = self.cache[a]
            seen_past = [e for c, e in enumerate(past) if mask is None or mask[a, c]]
            block = [(int(ids[a, i]), int(positions[a, i])) for i in range(q)]
            for i in range(q):
                if mask is not None and not mask[a, len(past) + i]:
                    continue  # filler after a short draft: never read
                before = [block[j] for j in range(q) if (visible[i][j] if visible is not None else j <= i)
                          and (mask is None or mask[a, len(past) + j])]
                seen = sorted(seen_past + before, key=lambda e: e[1])
                assert block[i][1] == len(seen) - 1, "the position is not the number of tokens it sees"
                logits[a, i, next_token([t for t, _ in seen])] = 1.0
            past.extend(block)
        return logits[:, -keep:]

    def crop(self, m):
        if m:
            self.cache = [row[:-m] for row in self.cache]

    def gather(self, rows, columns):
        assert self.can_gather
        self.gathers.append((rows, columns))
        if rows is not None:
            self.cache = [self.cache[r] for r in rows.tolist()]
        if columns is not None:
            self.cache = [[row[c] for c in cols] for row, cols in zip(self.cache, columns.tolist())]


def plain(prompt: list[int], max_length: int, eos: int = EOS) -> list[int]:
    seq = list(prompt)
    while len(seq) < max_length:
        seq.append(next_token(seq))
        if seq[-1] == eos:
            break
    return seq[len(prompt) :]


def run(prompts, max_length, target=None, trees=False, eos=EOS, **settings):
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :], mask[b, width - len(p) :] = torch.tensor(p), 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    spec = NgramSpeculator(**{"min_n": 1, "verify_cost": FLAT, **settings})
    sessions = [spec.start(p) for p in prompts]
    target = target or FakeTarget(len(prompts))
    options = Options(stop=StopRule(max_length=max_length, eos_token_ids=frozenset({eos})),
                      trees=trees, forward_cost=spec.cost_model)
    padded = None if all(len(p) == width for p in prompts) else mask
    result = speculative_decode(ids, padded, positions, sessions, target, options)
    new = [result.sequences[b, width:].tolist()[: result.stats[b].new_tokens] for b in range(len(prompts))]
    return new, result, target


def prompts_of(seed: int, count: int):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, V, size=int(rng.integers(3, 30))).tolist() for _ in range(count)]


@pytest.mark.parametrize("seed", range(6))
def test_one_row_equals_plain_decoding(seed):
    (prompt,) = prompts_of(seed, 1)
    (new,), result, target = run([prompt], len(prompt) + 80)
    assert new == plain(prompt, len(prompt) + 80)
    assert result.stats[0].accepted_tokens > 10  # drafts were really kept
    assert result.stats[0].drafted_tokens > result.stats[0].accepted_tokens  # and really rejected
    # The invariant after the loop: the cache holds every token but the last.
    assert len(target.cache[0]) == len(prompt) + len(new) - 1


@pytest.mark.parametrize("seed", range(4))
def test_left_padded_batch_equals_each_row_alone_and_compacts(seed):
    prompts = prompts_of(100 + seed, 4)
    width = max(len(p) for p in prompts)
    new, result, target = run(prompts, width + 150)
    for b, p in enumerate(prompts):
        assert new[b] == plain(p, len(p) + 150) and len(new[b]) == 150  # max_length counts padding
    steps = zip(*(s.accepted_per_step for s in result.stats))
    assert any(len(set(step)) > 1 for step in steps), "rows always kept the same amount: no holes"
    assert any(columns is not None for _, columns in target.gathers), "the cache was never compacted"


def test_unpadded_batch_starts_without_a_mask_and_masks_its_holes():
    prompts = [p[:3] + p[:3] * 4 for p in prompts_of(40, 3)]  # same length: no padding, no mask
    new, result, _ = run(prompts, 15 + 60)
    assert all(new[b] == plain(p, 15 + 60) for b, p in enumerate(prompts))
    assert any(len(set(step)) > 1 for step in zip(*(s.accepted_per_step for s in result.stats)))


def test_rows_leave_the_batch_when_they_stop():
    prompts = prompts_of(7, 3)
    width = max(len(p) for p in prompts)
    eos = plain(prompts[1], len(prompts[1]) + 40)[4]  # row 1 stops at its 5th new token (others maybe later)
    new, result, target = run(prompts, width + 40, eos=eos)
    assert all(new[b] == plain(p, len(p) + 40, eos) for b, p in enumerate(prompts))
    assert len(new[1]) <= 5 < max(len(n) for n in new), "no row left the batch before the others"
    assert any(rows is not None for rows, _ in target.gathers)
    assert run(prompts, width + 40, eos=eos, max_draft_tokens=4)[0] == new
    assert_accepted(result.stats)


def test_eos_inside_an_accepted_draft_ends_there():
    prompt = [5, 6, 7, 8, 9, 10, 11] * 3
    expected = plain(prompt, len(prompt) + 60)
    eos_token = expected[9]  # the 10th new token's id plays EOS: it may occur earlier
    first = expected.index(eos_token)
    spec_new, result, target = _run_with_eos(prompt, len(prompt) + 60, eos_token)
    assert spec_new == expected[: first + 1]
    assert result.stats[0].stop_reason == "eos"
    assert len(target.cache[0]) == len(prompt) + len(spec_new) - 1  # cut tokens were cropped
    assert result.stats[0].accepted_per_step[-1] > 0, "the EOS did not come inside an accepted draft"


def _run_with_eos(prompt, max_length, eos_token):
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT)
    target = FakeTarget(1)
    ids = torch.tensor([prompt])
    options = Options(stop=StopRule(max_length=max_length, eos_token_ids=frozenset({eos_token})))
    result = speculative_decode(ids, None, torch.arange(len(prompt))[None], [spec.start(prompt)], target, options)
    return result.sequences[0, len(prompt) :].tolist(), result, target


@pytest.mark.parametrize("max_new", [1, 2, 13, 40])
def test_max_length_is_met_exactly(max_new):
    (prompt,) = prompts_of(3, 1)
    (new,), result, _ = run([prompt], len(prompt) + max_new)
    assert new == plain(prompt, len(prompt) + max_new) and len(new) == max_new
    assert result.stats[0].stop_reason == "max_length"
    if max_new > 2:
        assert_accepted(result.stats)
    else:  # the prefill emits the first token, and a draft would leave the next step no room for its own
        assert result.stats[0].drafted_tokens == 0


def test_a_crop_only_cache_works_for_one_row():
    (prompt,) = prompts_of(5, 1)
    (new,), result, target = run([prompt], len(prompt) + 60, target=FakeTarget(1, can_gather=False))
    assert new == plain(prompt, len(prompt) + 60) and not target.gathers
    assert_accepted(result.stats)


@pytest.mark.parametrize("seed", range(4))
def test_token_trees_equal_plain_decoding_and_select_branch_columns(seed):
    (prompt,) = prompts_of(200 + seed, 1)
    prompt = prompt + prompt[::-1] + prompt  # repeats with different continuations: branches
    (new,), result, target = run([prompt], len(prompt) + 80, trees=True, tree_branches=3)
    assert new == plain(prompt, len(prompt) + 80)
    assert_accepted(result.stats)
    assert len(target.cache[0]) == len(prompt) + len(new) - 1


def test_trees_take_branch_paths_somewhere():
    taken = 0
    for seed in range(12):
        (prompt,) = prompts_of(300 + seed, 1)
        prompt = prompt + prompt[::-1] + prompt
        _, _, target = run([prompt], len(prompt) + 60, trees=True, tree_branches=4)
        taken += sum(columns is not None for _, columns in target.gathers)
    assert taken > 0, "no step kept a branch off the first chain: tree paths untested"


def test_compaction_keeps_each_rows_valid_columns_in_order():
    mask = torch.tensor([[0, 1, 0, 1, 1] + [0] * 40, [1, 1, 1, 0, 1] + [0] * 40])
    seen = []
    new = _maybe_compact(mask, mask.sum(1).tolist(), lambda rows, columns: seen.append(columns))
    assert new.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]  # right-aligned, left-padded again
    assert seen[0][0, -3:].tolist() == [1, 3, 4] and seen[0][1].tolist() == [0, 1, 2, 4]
    few_holes = torch.ones((2, 45), dtype=torch.long)
    few_holes[0, :20] = 0  # under a third of the cache and under 32 columns: left alone
    assert _maybe_compact(few_holes, few_holes.sum(1).tolist(), None) is few_holes
