"""The batched drafting kernel (ngramspec/draft/sessions.py) must draft exactly what one
SpeculationSession per row drafts (its pure-Python reference): same tokens, same acceptance
estimate, same copy cursor, step after step, for several rows in one call, with the shared
history, fuzzy re-alignment and every match policy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngramspec import NgramSpeculator
from ngramspec.draft.sessions import ACTIVE, CURSOR, LOST_AT, LOST_SOURCE, VERIFIED, SessionTable


def run_both(config, prompts, steps, verified_draws, limits_draws, history_outputs=()):
    """Drive a SessionTable (all rows per call) and one SpeculationSession per row through the
    same steps; assert they agree at every step. Returns the drafts' total length."""
    spec = NgramSpeculator(config)
    for output in history_outputs:
        spec.history.add(np.array(output, dtype=np.int32))
    table = SessionTable(spec.config, spec.history, slots=2)  # grows on the third row
    rows = len(prompts)
    texts = [list(p) for p in prompts]
    width = max(len(t) for t in texts) + sum(len(s[b]) for s in steps for b in range(rows)) + 1
    token_ids = np.zeros((rows + 1, width), dtype=np.int32)  # one spare row: rows need not start at 0
    sessions = [spec.start(np.array(p, dtype=np.int32)) for p in prompts]
    slots = np.array([table.new(len(p)) for p in prompts])
    index = np.arange(1, rows + 1)
    drafted = 0
    for step, new in enumerate(steps):
        assert table.pool.tolist() == spec.pool.tolist(), step
        for b in range(rows):
            texts[b] += new[b]
            token_ids[index[b], : len(texts[b])] = texts[b]
        limits = np.array([limits_draws[(step * rows + b) % len(limits_draws)] for b in range(rows)])
        ends = np.array([len(t) for t in texts])
        verified_before = table.state[slots, VERIFIED].copy()
        drafts, lengths, acceptance = table.draft(token_ids, index, ends, slots, limits)
        for b in range(rows):  # row by row, as the kernel goes (the pooled evidence sees that order)
            if step > 0 and new[b]:  # the reference extends with what the table reads from token_ids
                sessions[b].extend(np.array(new[b], dtype=np.int32), verified=int(verified_before[b]))
            expected = sessions[b].propose(max_tokens=int(limits[b]), sized=False, tree=False)
            assert drafts[b, : lengths[b]].tolist() == expected.tokens.tolist(), (step, b)
            assert acceptance[b, : lengths[b]].tolist() == expected.acceptance.tolist(), (step, b)
            assert table.state[slots[b], CURSOR] == sessions[b]._cursor
            assert (table.state[slots[b], LOST_AT], table.state[slots[b], LOST_SOURCE]) == sessions[b]._lost
            assert table.tokens(slots[b]).tolist() == texts[b]
            verified = verified_draws[(step * rows + b) % len(verified_draws)] % (lengths[b] + 1)
            table.state[slots[b], VERIFIED], table.state[slots[b], ACTIVE] = verified, 1
            drafted += int(lengths[b])
    return drafted


tokens = st.integers(0, 4)


@settings(max_examples=200, deadline=None)
@given(
    min_n=st.integers(1, 3), extra_n=st.integers(0, 3), recent=st.booleans(), cursor=st.booleans(),
    fuzzy=st.booleans(), history=st.booleans(),
    prompts=st.lists(st.lists(tokens, min_size=1, max_size=30), min_size=1, max_size=3),
    steps=st.lists(st.lists(st.lists(tokens, max_size=5), min_size=3, max_size=3), min_size=1, max_size=12),
    verified=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    limits=st.lists(st.integers(0, 8), min_size=1, max_size=8),
    history_outputs=st.lists(st.lists(tokens, min_size=1, max_size=12), max_size=3),
)
def test_the_kernel_drafts_what_one_session_per_row_drafts(min_n, extra_n, recent, cursor, fuzzy, history, prompts,
                                                           steps, verified, limits, history_outputs):
    config = dict(min_n=min_n, max_n=min_n + extra_n, match="recent" if recent else "earliest",
                  copy_cursor=cursor, fuzzy_resync=fuzzy, max_draft_tokens=8, payoff_sizing=False,
                  history_tokens=64 if history else 0)
    steps = [s[: len(prompts)] for s in steps]
    steps[0] = [[] for _ in prompts]  # the first call indexes the prompts
    run_both(NgramSpeculator(**config).config, prompts, steps, verified, limits,
             history_outputs if history else ())


def test_copies_edits_and_loops_draft_like_the_reference():
    """A long case that exercises every source: a copied span with a substituted token (the
    cursor breaks, fuzzy re-alignment resumes), a loop, and the history."""
    rng = np.random.default_rng(0)
    source = rng.integers(10, 60, 80).tolist()
    output = source[:20] + [99] + source[21:50] + [98, 97] + source[50:70] + [5, 6] * 10
    config = NgramSpeculator(max_draft_tokens=12, payoff_sizing=False, history_tokens=500).config
    steps = [[[]]] + [[output[i : i + 3]] for i in range(0, len(output), 3)]
    drafted = run_both(config, [source], steps, [12, 3, 0, 7], [12, 5, 12], history_outputs=[source[30:60]])
    assert drafted > 100


def test_the_worked_example_from_the_docstring():
    table = SessionTable(NgramSpeculator(min_n=1, max_n=3).config)
    s = table.new(5)
    drafts, lengths, acceptance = table.draft(np.array([[5, 6, 7, 5, 6]], dtype=np.int32), np.array([0]),
                                              np.array([5]), np.array([s]), np.array([4]))
    assert drafts[0, : lengths[0]].tolist() == [7, 5, 6, 7]
    assert acceptance[0, :4].tolist() == pytest.approx([2 / 3, 2 / 3, 0.8, 0.8])
