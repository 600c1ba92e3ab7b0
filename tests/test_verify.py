"""The verify step on literal logits (no model): which draft tokens are kept, what is emitted,
which prefixes the processors see, and what is recorded."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ngramspec.draft.walk import accepted_length, follow
from ngramspec.hf import verify
from ngramspec.hf.verify import Verdict, tree_layout, verify_step

V = 10


def logits_choosing(*rows_of_choices):
    """(A, q, V) logits whose argmax at row a, position j is rows_of_choices[a][j]."""
    q = max(len(r) for r in rows_of_choices)
    out = torch.zeros((len(rows_of_choices), q, V))
    for a, choices in enumerate(rows_of_choices):
        for j, token in enumerate(choices):
            out[a, j, token] = 5.0
    return out


@pytest.mark.parametrize(
    "draft, choices, tokens, path",
    [
        ([5, 7, 9], [5, 7, 9, 4], [5, 7, 9, 4], [0, 1, 2]),  # all kept, plus the target's own
        ([5, 7, 9], [3, 7, 9, 4], [3], []),  # rejected at once: the target's own token only
        ([5, 7, 9], [5, 7, 2, 4], [5, 7, 2], [0, 1]),  # kept up to the first disagreement
        ([], [6], [6], []),  # no draft: a plain step
        ([5, 5, 5], [5, 5, 6, 5], [5, 5, 6], [0, 1]),  # repeated tokens: follows positions, not values
    ],
)
def test_chain(draft, choices, tokens, path):
    (verdict,) = verify_step([draft], None, logits_choosing(choices))
    assert (verdict.tokens, verdict.path) == (tokens, path)
    assert verdict.is_prefix


def test_rows_of_a_batch_keep_their_own_amounts():
    # Row 0's draft is shorter: its block is padded to q = 4 and the padding never read.
    logits = logits_choosing([5, 1, 1, 1], [5, 7, 8, 9])
    got = verify_step([[5], [5, 7, 9]], None, logits)
    assert [(v.tokens, v.path) for v in got] == [([5, 1], [0]), ([5, 7, 8], [0, 1])]


def test_tree_follows_the_branch_the_target_chose():
    # Draft tree: 5 and 6 both follow the last token; 7 follows 6; 2 follows 5.
    tokens, parents = [5, 6, 7, 2], [-1, -1, 1, 0]
    # Block rows: 0 last, 1 -> 5, 2 -> 6, 3 -> 7, 4 -> 2. The target picks 6, then 7, then 8.
    logits = logits_choosing([6, 0, 7, 8, 0])
    (verdict,) = verify_step([tokens], [parents], logits)
    assert (verdict.tokens, verdict.path) == ([6, 7, 8], [1, 2])
    assert not verdict.is_prefix
    depth, visible = tree_layout(parents)
    assert depth == [0, 1, 1, 2, 2]
    assert visible[3] == [True, False, True, True, False]  # 7 sees the last token, 6 and itself


def test_follow_stops_without_emitting_when_the_continuation_runs_out():
    assert follow([1, 2, 3], None, lambda row, emitted: [1, 2][len(emitted)] if len(emitted) < 2 else None) == (
        [1, 2], [0, 1])
    assert accepted_length([1, 2, 3], None, [1, 2, 3]) == 3
    assert accepted_length([1, 2, 3], None, [1, 9, 3]) == 1
    assert accepted_length([5, 6, 7], [-1, -1, 1], [6, 7]) == 2


class Recorder:
    """A processor stand-in: records the prefix each position is scored with and bans token 5
    right after a 7 (so the prefix decides the choice)."""

    def __init__(self):
        self.calls = []

    def __call__(self, a, emitted, logits_row):
        self.calls.append((a, list(emitted)))
        scores = logits_row.clone()
        if emitted and emitted[-1] == 7:
            scores[0, 5] = -float("inf")
        return scores


@pytest.mark.parametrize("at_once", [False, True])
def test_processors_see_the_prefix_of_each_position(at_once, monkeypatch):
    monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: at_once)
    logits = logits_choosing([7, 5, 5, 5])
    logits[0, 1, 3] = 4.0  # the runner-up after 7, chosen once 5 is banned there
    record = Recorder()
    (verdict,) = verify_step([[7, 5, 5]], None, logits, score=record, keep=True)
    assert (verdict.tokens, verdict.path) == ([7, 3], [0])
    if at_once:  # every position scored assuming the drafts before it were kept, in one sync
        assert record.calls == [(0, []), (0, [7]), (0, [7, 5]), (0, [7, 5, 5])]
    else:  # position by position, stopping at the first rejection
        assert record.calls == [(0, []), (0, [7])]
    assert len(verdict.scores) == len(verdict.logits) == 2
    assert verdict.scores[1][5] == -float("inf") and verdict.logits[1][5] == 5.0  # processed vs raw


def test_greedy_without_processors_records_raw_logits():
    logits = logits_choosing([5, 7, 2])
    (verdict,) = verify_step([[5, 7]], None, logits, keep=True)
    assert verdict.tokens == [5, 7, 2]
    assert all(torch.equal(s, logits[0, j]) for j, s in enumerate(verdict.scores))


@pytest.mark.parametrize("at_once", [False, True])
def test_sampling_keeps_a_draft_token_with_its_probability(at_once, monkeypatch):
    """Sample-and-compare: draft token d is kept with probability p(d), and a rejection never
    emits d. p(d) = 0.3; 3,000 steps: the kept fraction has standard deviation 0.0084, so the
    +-0.04 band (4.8 sd) fails a correct verifier with probability < 2e-6 and catches a verifier
    that keeps d with probability 0.35 or 0.25 (a 5-point bias) with probability > 0.99."""
    monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: at_once)
    torch.manual_seed(0)
    logits = torch.full((1, 3, V), -1e9)
    logits[0, 0, 4] = 0.0  # position 0: the draft token 4 is certain
    logits[0, 1, 2], logits[0, 1, 3] = torch.tensor(0.3).log(), torch.tensor(0.7).log()
    logits[0, 2, 9] = 0.0  # after the draft: 9
    kept = 0
    for _ in range(3000):
        (verdict,) = verify_step([[4, 2]], None, logits, uniform=lambda a, j: torch.rand(()).item())
        assert verdict.tokens[0] == 4
        if verdict.path == [0, 1]:
            assert verdict.tokens == [4, 2, 9]
            kept += 1
        else:
            assert verdict.tokens == [4, 3]  # rejected: drawn from p without the draft token
    assert abs(kept / 3000 - 0.3) < 0.04


def test_verdict_defaults():
    assert Verdict([1], []).is_prefix and Verdict([1, 2], [0]).is_prefix and not Verdict([1, 2], [1]).is_prefix


def test_inverse_cdf_pick_never_emits_a_zero_probability_token():
    """Uniforms at the ends of [0, 1) land on the first and last tokens that have mass."""
    scores = torch.full((3, V), -float("inf"))
    scores[:, 3], scores[:, 6] = 0.0, 1.0
    last_below_one = 1 - 2.0**-53
    assert verify.pick(scores, [0.0, last_below_one, 0.5]) == [3, 6, 6 if 0.5 > 1 / (1 + torch.e) else 3]
    assert verify.pick(scores, None) == [6, 6, 6]


@given(st.lists(st.integers(0, 3), max_size=8), st.lists(st.integers(0, 3), max_size=10))
def test_a_chain_keeps_what_the_tree_walk_keeps(draft, continuation):
    """accepted_length's chain shortcut (a common prefix) equals the walk of follow() over the
    same draft given as a tree whose every token follows the one before."""
    def recorded(row, emitted):
        return continuation[len(emitted)] if len(emitted) < len(continuation) else None

    as_tree = len(follow(draft, list(range(-1, len(draft) - 1)), recorded)[1])
    assert accepted_length(draft, None, continuation) == as_tree
    assert accepted_length(np.array(draft, dtype=np.int32), None, np.array(continuation)) == as_tree
