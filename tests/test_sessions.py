"""The drafting engine (ngramspec/draft/sessions.py) must draft exactly what its pure-Python
reference (tests/reference_session.py) drafts, step after step: for many rows in one call (the
vLLM route: chains, unsized), and for one slot (the transformers route: sized drafts, token
trees, cut-short verification); same tokens, trees, acceptance estimates, copy cursor and learned
edits, with the shared history, fuzzy re-alignment and every match policy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngramspec import NgramSpeculator
from ngramspec.draft.config import DraftTuning
from ngramspec.draft.history import History
from ngramspec.draft.index import table_size
from ngramspec.draft.session import SpeculationSession
from ngramspec.draft.sessions import ACTIVE, CURSOR, LOST_AT, LOST_SOURCE, VERIFIED, SessionTable, slot_index

from reference_session import ReferenceSession


def run_both(config, prompts, steps, verified_draws, limits_draws, history_outputs=()):
    """Drive a SessionTable (all rows per call) and one ReferenceSession per row through the
    same steps; assert they agree at every step. Returns the drafts' total length."""
    spec = NgramSpeculator(config)
    for output in history_outputs:
        spec.history.add(np.array(output, dtype=np.int32))
    table = SessionTable(spec.config, spec.history, slots=2)  # grows on the third row
    rows = len(prompts)
    texts = [list(p) for p in prompts]
    width = max(len(t) for t in texts) + sum(len(s[b]) for s in steps for b in range(rows)) + 1
    token_ids = np.zeros((rows + 1, width), dtype=np.int32)  # one spare row: rows need not start at 0
    sessions = [ReferenceSession(spec.config, np.array(p, dtype=np.int32), history=spec.history, pool=spec.pool)
                for p in prompts]
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
            assert list(SessionEdits(table, slots[b]).items()) == list(sessions[b]._edits.items())
            verified = verified_draws[(step * rows + b) % len(verified_draws)] % (lengths[b] + 1)
            table.state[slots[b], VERIFIED], table.state[slots[b], ACTIVE] = verified, 1
            drafted += int(lengths[b])
    return drafted


tokens = st.integers(0, 4)


@settings(max_examples=200, deadline=None)
@given(
    min_n=st.integers(1, 3), extra_n=st.integers(0, 3), recent=st.booleans(), cursor=st.booleans(),
    fuzzy=st.booleans(), history=st.booleans(), edits=st.booleans(),
    prompts=st.lists(st.lists(tokens, min_size=1, max_size=30), min_size=1, max_size=3),
    steps=st.lists(st.lists(st.lists(tokens, max_size=5), min_size=3, max_size=3), min_size=1, max_size=12),
    verified=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    limits=st.lists(st.integers(0, 8), min_size=1, max_size=8),
    history_outputs=st.lists(st.lists(tokens, min_size=1, max_size=12), max_size=3),
)
def test_the_kernel_drafts_what_one_session_per_row_drafts(min_n, extra_n, recent, cursor, fuzzy, history, edits,
                                                           prompts, steps, verified, limits, history_outputs):
    config = dict(min_n=min_n, max_n=min_n + extra_n, match="recent" if recent else "earliest",
                  copy_cursor=cursor, fuzzy_resync=fuzzy, max_draft_tokens=8, payoff_sizing=False,
                  history_tokens=64 if history else 0, edit_recurrence=edits)
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
    config = NgramSpeculator(max_draft_tokens=12, payoff_sizing=False, history_tokens=500, edit_recurrence=True).config
    steps = [[[]]] + [[output[i : i + 3]] for i in range(0, len(output), 3)]
    drafted = run_both(config, [source], steps, [12, 3, 0, 7], [12, 5, 12], history_outputs=[source[30:60]])
    assert drafted > 100


def SessionEdits(table, s):
    """Slot s's learned edits as the reference keeps them (a dict in the order learned)."""
    t, sizes, stamps = table.edit_tokens[s], table.edit_sizes[s], table.edit_stamps[s]
    return {tuple(t[e, 0, : sizes[e, 0]].tolist()): tuple(t[e, 1, : sizes[e, 1]].tolist())
            for e in np.argsort(stamps) if stamps[e]}


CURVE = ((1, 1.0), (4, 1.05), (8, 1.1), (16, 1.3), (32, 2.0))  # branches fit within the tree's slack


@settings(max_examples=300, deadline=None)
@given(
    min_n=st.integers(1, 3), extra_n=st.integers(0, 3), recent=st.booleans(), cursor=st.booleans(),
    fuzzy=st.booleans(), edits=st.booleans(), branches=st.integers(1, 4), history=st.booleans(),
    prompt=st.lists(tokens, min_size=1, max_size=40),
    history_output=st.lists(tokens, min_size=1, max_size=12),
    tuning=st.one_of(st.just(DraftTuning()), st.builds(
        DraftTuning, fuzzy_window=st.integers(1, 12), fuzzy_context=st.integers(1, 6), fuzzy_ahead=st.integers(1, 16),
        fuzzy_below_n=st.integers(0, 4), edit_span=st.integers(1, 8), max_edits=st.integers(1, 8),
        tree_cost_slack=st.sampled_from([0.0, 0.05, 0.3]), request_weight=st.sampled_from([1.0, 4.0, 9.0]),
        pool_prior_weight=st.sampled_from([1.0, 2.0, 5.0]), pool_window=st.sampled_from([4.0, 64.0, 4096.0]),
        first_risk=st.sampled_from([0.0, 0.1, 0.5]))),
    max_loss=st.sampled_from([None, 0.0, 0.02, 0.3]),
    steps=st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.booleans(), st.integers(0, 9),
                             st.lists(tokens, min_size=1, max_size=3), st.integers(-1, 9)), min_size=1, max_size=25),
)
def test_one_slot_drafts_sized_trees_like_the_reference(min_n, extra_n, recent, cursor, fuzzy, edits, branches,
                                                        history, prompt, history_output, tuning, max_loss, steps):
    """The transformers route: every propose (sized or not, tree or chain, any limit) gives the
    reference's draft, tree and estimates; every extend (drafted tokens kept in part, verified in
    full or cut short) leaves the same cursor, break and edits; under any draft_tuning."""
    config = NgramSpeculator(min_n=min_n, max_n=min_n + extra_n, match="recent" if recent else "earliest",
                             copy_cursor=cursor, fuzzy_resync=fuzzy, edit_recurrence=edits, tree_branches=branches,
                             max_draft_tokens=8, max_tree_tokens=12, verify_cost=CURVE, max_loss=max_loss,
                             history_tokens=64 if history else 0, draft_tuning=tuning).config
    histories = [History(config) if history else None for _ in range(2)]
    for h in histories:
        if h is not None:
            h.add(np.array(history_output, dtype=np.int32))
    prompt = np.array(prompt, dtype=np.int32)
    reference = ReferenceSession(config, prompt, history=histories[0])
    engine = SpeculationSession(config, prompt, history=histories[1])
    for limit, sized, tree, kept, new, verified in steps:
        expected, draft = reference.propose(limit, sized, tree), engine.propose(limit, sized, tree)
        assert draft.tokens.tolist() == expected.tokens.tolist()
        assert (draft.parents is None and expected.parents is None) or \
            draft.parents.tolist() == expected.parents.tolist()
        assert draft.acceptance.tolist() == expected.acceptance.tolist()
        assert (draft.match_len, draft.source_start) == (expected.match_len, expected.source_start)
        emitted = np.array(expected.tokens[: kept % (len(expected) + 1)].tolist() + new, dtype=np.int32)
        verified = None if verified < 0 or not len(expected) else verified % (len(expected) + 1)
        reference.extend(emitted, verified)
        engine.extend(emitted, verified)
        assert engine.tokens.tolist() == reference.tokens.tolist()
        assert (engine.cursor, engine.lost) == (reference._cursor, reference._lost)
        assert list(engine.edits.items()) == list(reference._edits.items())  # in the order learned
    reference.finish()
    engine.finish()
    if history:
        assert histories[1].tokens.tolist() == histories[0].tokens.tolist()


@pytest.mark.parametrize("seed", range(20))
def test_one_slot_learns_edits_like_the_reference_while_decoding_a_rewrite(seed):
    """Decode a rewrite of the prompt (several words replaced everywhere, some inserted or
    dropped, the whole repeated) the way a verify loop does: each step keeps the draft's prefix
    that agrees with the rewrite, plus the rewrite's next token. Edits are learned, applied,
    refused, relearned and evicted (more replacements than MAX_EDITS), alike in both."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 1000, 80).tolist()
    replaced = {int(t): int(t) + 1000 for t in rng.choice(prompt, 14, replace=False)}
    rewrite = []
    for t in prompt * 3:
        roll = rng.random()
        if roll < 0.03:
            continue  # dropped
        rewrite += [replaced.get(t, t)] if roll < 0.97 else [t, 2000 + t]  # replaced, or a word inserted
    config = NgramSpeculator(edit_recurrence=True, tree_branches=int(rng.integers(1, 4)), max_draft_tokens=8,
                             max_tree_tokens=12, verify_cost=CURVE, max_loss=[None, 0.02][seed % 2],
                             draft_tuning=DraftTuning(max_edits=8 if seed % 2 else 3)).config
    reference = ReferenceSession(config, np.array(prompt, dtype=np.int32))
    engine = SpeculationSession(config, np.array(prompt, dtype=np.int32))
    done, learned = 0, 0
    while done < len(rewrite):
        sized, tree = bool(rng.integers(2)), bool(rng.integers(2))
        expected, draft = reference.propose(None, sized, tree), engine.propose(None, sized, tree)
        assert draft.tokens.tolist() == expected.tokens.tolist()
        assert draft.acceptance.tolist() == expected.acceptance.tolist()
        chain = draft.tokens[: len(draft.acceptance)].tolist()
        kept = 0
        while kept < len(chain) and done + kept < len(rewrite) and chain[kept] == rewrite[done + kept]:
            kept += 1
        emitted = np.array(rewrite[done : done + kept + 1], dtype=np.int32)
        done += len(emitted)
        reference.extend(emitted)
        engine.extend(emitted)
        assert (engine.cursor, engine.lost) == (reference._cursor, reference._lost)
        assert list(engine.edits.items()) == list(reference._edits.items())  # in the order learned
        learned = max(learned, len(engine.edits))
    assert learned >= 3  # several edits at once (most cases fill the store and evict)


def test_the_worked_example_from_the_docstring():
    table = SessionTable(NgramSpeculator(min_n=1, max_n=3).config)
    s = table.new(5)
    drafts, lengths, acceptance = table.draft(np.array([[5, 6, 7, 5, 6]], dtype=np.int32), np.array([0]),
                                              np.array([5]), np.array([s]), np.array([4]))
    assert drafts[0, : lengths[0]].tolist() == [7, 5, 6, 7]
    assert acceptance[0, :4].tolist() == pytest.approx([2 / 3, 2 / 3, 0.8, 0.8])


def test_a_new_slot_starts_with_a_table_for_its_prompt():
    """A request's prompt arrives in its slot's first extend: the slot's n-gram table starts
    with room for 1.5 n-grams a prompt token (text stores 1.05-1.6), so that extend does not
    regrow it from 16 slots (a random prompt, ~1.05 a token, fits as it is), and it grows past
    that with what the text stores, all of it still found. A released slot taken by a short
    prompt starts small again."""
    table = SessionTable(NgramSpeculator(min_n=1, max_n=4).config)
    s = table.new(600)
    sized = slot_index(table.indexes, s)[1]
    assert sized.size == table_size(900)
    text = np.random.default_rng(0).integers(0, 49_152, size=1_800).astype(np.int32)
    text[597:600] = text[100:103]  # the prompt ends in a 3-gram seen at 100: the draft copies from 103
    text[-3:] = text[700:703]  # so does the longer text, from 703
    for end, start in ((600, 103), (1_800, 703)):
        drafts, lengths, _ = table.draft(text[None], np.array([0]), np.array([end]), np.array([s]), np.array([4]))
        assert drafts[0, : lengths[0]].tolist() == text[start : start + 4].tolist()
        grown = slot_index(table.indexes, s)[1]
        same = (grown.ctypes.data, grown.size) == (sized.ctypes.data, sized.size)
        assert same == (end == 600)  # the prompt fits; three times its length does not
    table.release(s)
    assert slot_index(table.indexes, table.new(8))[1].size == 16
