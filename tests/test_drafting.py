"""Where drafts come from: copy cursor, fuzzy re-alignment, token trees, cross-request history."""

import numpy as np
import pytest
import torch

from ngramspec import NgramSpeculator
from ngramspec.draft.config import SpeculatorConfig
from ngramspec.draft.sessions import CURSOR, slot_index
from ngramspec.draft.walk import accepted_length

from conftest import plain_generate

FLAT = ((1, 1.0), (64, 1.0))  # verification costs the same at any size: trees take branches


def session_of(prompt, **settings):
    settings = {"payoff_sizing": False, "fuzzy_resync": False, **settings}
    return NgramSpeculator(**settings).start(np.array(prompt))


def test_cursor_follows_a_copy_and_breaks_on_a_difference():
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 5, 6]
    session = session_of(prompt, min_n=2, max_draft_tokens=3)
    assert session.propose().tokens.tolist() == [7, 8, 9]  # index: "5 6" -> 7 8 9
    session.extend([7, 8])
    assert session.cursor == 4  # the copy continues at 9
    assert session.propose().tokens.tolist() == [9, 10, 11]
    session.extend([9, 99])  # the target diverged: cursor breaks, break point recorded
    assert session.cursor == -1 and session.lost == (len(prompt) + 3, 5)  # at 99, source expected 10


def test_cursor_prefers_the_followed_span_over_a_more_recent_match():
    # Two copies of "1 2 3" with different continuations; the output copies the first one.
    prompt = [1, 2, 3, 4, 5, 6, 50, 1, 2, 3, 7, 8, 60, 1, 2]
    with_cursor = session_of(prompt, min_n=2, max_draft_tokens=2, copy_cursor=True)
    without = session_of(prompt, min_n=2, max_draft_tokens=2, copy_cursor=False)
    for s in (with_cursor, without):
        s._table.state[s._slot, CURSOR] = 2  # following the first span: "1 2" was copied from positions 0-1
        s.extend([3])
    assert with_cursor.propose().tokens.tolist() == [4, 5]  # the followed span
    assert without.propose().tokens.tolist() == [7, 8]  # the most recent "2 3"


def test_fuzzy_resync_after_a_substituted_word():
    # Source "10 .. 17"; the output copies "10 11", writes 99 instead of 12, then 13 (the
    # source's next word): exact 2-gram lookup ("99 13") finds nothing to copy.
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 30, 10, 11]
    on = session_of(prompt, min_n=2, max_draft_tokens=3, fuzzy_resync=True)
    off = session_of(prompt, min_n=2, max_draft_tokens=3, fuzzy_resync=False)
    for s in (on, off):
        assert s.propose().tokens.tolist() == [12, 13, 14]
        s.extend([99])  # the substitution
        assert s.propose().tokens.tolist() == []
        s.extend([13])
    assert off.propose().tokens.tolist() == []
    assert on.propose().tokens.tolist() == [14, 15, 16]  # resumed after "13" in the source


def test_history_drafts_from_an_earlier_output():
    spec = NgramSpeculator(min_n=2, max_draft_tokens=4, payoff_sizing=False, history_tokens=64)
    first = spec.start(np.array([1, 2, 3]))
    first.extend([20, 21, 22, 23, 24, 25])
    first.finish()
    second = spec.start(np.array([4, 5, 20, 21]))  # its own text has "20 21" only at the end
    assert second.propose().tokens.tolist() == [22, 23, 24, 25]
    alone = NgramSpeculator(min_n=2, max_draft_tokens=4, payoff_sizing=False).start(np.array([4, 5, 20, 21]))
    assert alone.propose().tokens.tolist() == []


def test_a_longer_match_in_history_outranks_a_shorter_one_in_the_request():
    """Earlier outputs continued "7 8 9" with 30 31; this request's own text has only "8 9"
    (followed by 40): the longer context wins. With its own "7 8 9" (followed by 50) the
    request's text wins again (the two matches are equally long)."""
    spec = NgramSpeculator(min_n=1, max_n=4, max_draft_tokens=2, payoff_sizing=False, fuzzy_resync=False,
                           history_tokens=64)
    first = spec.start(np.array([1]))
    first.extend([7, 8, 9, 30, 31, 32])
    first.finish()
    assert spec.start(np.array([8, 9, 40, 41, 7, 8, 9])).propose().tokens.tolist() == [30, 31]
    assert spec.start(np.array([7, 8, 9, 50, 51, 7, 8, 9])).propose().tokens.tolist() == [50, 51]


def test_history_is_bounded_and_keeps_the_newest():
    spec = NgramSpeculator(history_tokens=32)
    for i in range(20):
        session = spec.start(np.array([1]))
        session.extend(np.arange(100 + 10 * i, 110 + 10 * i))
        session.finish()
    assert spec.history.index.length <= 32
    assert 295 in spec.history.index.tokens[: spec.history.index.length]  # the last output


def test_tree_merges_candidates_into_a_trie():
    # "1 2" followed by "3 4 5" and by "6 7 8": a tree with both branches.
    prompt = [1, 2, 3, 4, 5, 0, 1, 2, 6, 7, 8, 0, 1, 2]
    session = session_of(prompt, min_n=2, max_n=2, max_draft_tokens=3, tree_branches=2, verify_cost=FLAT)
    draft = session.propose()
    assert draft.tokens.tolist() == [6, 7, 8, 3, 4, 5]  # the most recent first, then the other
    assert draft.parents.tolist() == [-1, 0, 1, -1, 3, 4]
    assert accepted_length(draft.tokens, draft.parents, np.array([3, 4, 9])) == 2
    assert accepted_length(draft.tokens, draft.parents, np.array([6, 7, 8])) == 3


def test_tree_branches_respect_the_cost_curve():
    prompt = [1, 2, 3, 4, 5, 0, 1, 2, 6, 7, 8, 0, 1, 2]
    steep = ((1, 1.0), (64, 64.0))  # every extra position costs a token: no branches
    session = session_of(prompt, min_n=2, max_n=2, max_draft_tokens=3, tree_branches=2, verify_cost=steep)
    assert session.propose().parents is None


@pytest.mark.parametrize("per_token, branches", [(0.0, True), (0.01, False)])
def test_trees_are_sized_by_the_measured_costs(per_token, branches):
    """With the cost model (verify_cost=None), trees branch where the timed forwards say extra
    positions are nearly free (a GPU), and not where each costs a token."""
    prompt = [1, 2, 3, 4, 5, 0, 1, 2, 6, 7, 8, 0, 1, 2]
    spec = NgramSpeculator(min_n=2, max_n=2, max_draft_tokens=3, tree_branches=2, payoff_sizing=False,
                           fuzzy_resync=False)
    for q in range(1, 26):
        for _ in range(3):
            spec.cost_model.observe(q, len(prompt), 0.01 + per_token * (q - 1))
    draft = spec.start(np.array(prompt)).propose()
    assert (draft.parents is not None) == branches


@pytest.mark.parametrize("seed", range(4))
def test_tree_drafts_are_exact_and_used(tiny_model, seed):
    """Greedy with token trees (several candidate continuations per pass) equals plain greedy;
    some steps accept a path that is not a prefix of the verified block (KV compaction)."""
    from ngramspec.hf.target import HFTarget

    paths = []
    original = HFTarget.gather

    def recording(self, rows, columns):  # a batch of one gathers columns only for a tree path
        paths.append(columns)
        return original(self, rows, columns)

    HFTarget.gather = recording
    try:
        rng = np.random.default_rng(seed)
        spec = NgramSpeculator(min_n=1, tree_branches=4, verify_cost=FLAT)
        for _ in range(6):
            length = int(rng.integers(5, 60))
            phrase = rng.integers(2, 40, size=max(2, length // 3))
            prompt = np.concatenate([phrase] * 3 + [rng.integers(2, 40, size=length)])[:length]
            ids = torch.tensor([prompt.tolist()])
            max_new = int(rng.integers(5, 80))
            for kwargs in (dict(), dict(repetition_penalty=1.3)):
                expected = plain_generate(tiny_model, ids, max_new_tokens=max_new, **kwargs)
                got = tiny_model.generate(ids, max_new_tokens=max_new, ngram_speculator=spec, **kwargs)
                assert got.tolist() == expected.tolist()
    finally:
        HFTarget.gather = original
    assert paths, "no tree step accepted a non-prefix path: compaction untested"


def test_auto_off_declines_through_a_mismatch_stretch_and_resumes_when_copies_return():
    """Payoff sizing switches drafting off while drafts keep failing (declined steps) and back on
    once copies are accepted again; the decline count is in the stats the loop records."""
    prompt = list(range(100, 300))  # 200 distinct tokens
    spec = NgramSpeculator(min_n=1, max_n=1, match="earliest", copy_cursor=False, fuzzy_resync=False,
                           verify_cost=((1, 1.0), (2, 1.6), (16, 2.0)))
    session = spec.start(np.array(prompt))

    def step(truth):  # one verify step against the tokens the "target" will emit
        draft = session.propose()
        k, accepted = len(draft), 0
        while accepted < k and draft.tokens[accepted] == truth[accepted]:
            accepted += 1
        session.extend(list(truth[: accepted + 1]))
        return k, accepted, k == 0 and draft.source_start >= 0

    # 1. Mismatch stretch: every token has an earlier occurrence (a match), but the target never
    # continues it (it jumps 7 tokens ahead each time): drafts fail, then are declined.
    stretch = [prompt[(7 * i) % 60] for i in range(1, 41)]
    mismatch = [step(stretch[i:]) for i in range(40)]
    assert sum(accepted for _, accepted, _ in mismatch) == 0
    assert sum(declined for *_, declined in mismatch) >= 25  # mostly plain steps
    assert sum(k > 0 for k, _, _ in mismatch[-20:]) >= 1  # but it keeps probing now and then

    # 2. Copying returns (the prompt again, from where the stretch left off): drafting resumes.
    copy = prompt[prompt.index(stretch[-1]) + 1 :]  # 159 tokens
    results, emitted = [], 0
    while emitted < 100:
        k, accepted, declined = step(copy[emitted:])
        results.append((k, accepted, declined))
        emitted += accepted + 1
    first_draft = next(i for i, (k, _, _) in enumerate(results) if k > 0)
    assert first_draft <= 15  # old evidence fades while declining
    tail = results[first_draft + 2 :]
    assert tail and all(k > 0 and accepted == k for k, accepted, _ in tail)  # on, and paying


@pytest.mark.parametrize("seed", range(3))
def test_a_request_that_never_copies_retries_rarely_where_a_verify_costs_two_steps(seed):
    """A request whose every draft is refused (random tokens over 40 ids: its n-grams recur, its
    continuations do not), where verifying any draft costs ~2 plain steps (long prompts on a CPU):
    after each refusal the request waits while its evidence and calibration fade
    (acceptance_memory 0.97) before it retries, so it stays within 4% of plain decoding (replay
    prices every forward; 0.95-0.96x before the calibration). With the former 0.9 it retries
    ~2x as often and runs at 0.93-0.94x."""
    from ngramspec.cost.curves import CostCurve
    from ngramspec.draft.replay import replay

    dear = ((1, 1.0), (2, 1.9), (4, 1.9), (12, 2.2), (25, 2.9))
    rng = np.random.default_rng(seed)
    prompt, output = rng.integers(0, 40, 1500), rng.integers(0, 40, 200)
    default_memory = SpeculatorConfig().acceptance_memory
    result = {memory: replay(NgramSpeculator(verify_cost=dear, acceptance_memory=memory).start(prompt), output,
                             CostCurve(dear)) for memory in (0.9, default_memory)}
    default = result[default_memory]
    assert default.stats.steps_with_draft >= 1  # it does try
    assert default.speedup >= 0.96
    assert result[0.9].speedup < 0.945  # the measure separates the two rules


def test_finishing_a_session_twice_adds_its_output_to_history_once():
    spec = NgramSpeculator(history_tokens=1000)
    session = spec.start([5, 6, 7])
    session.extend([8, 9, 10])
    session.finish()
    length = spec.history.index.length
    assert length > 0
    session.finish()
    assert spec.history.index.length == length


def test_history_stays_within_its_bound_under_eviction():
    """Many outputs, some longer than the whole store: the stored tokens never exceed
    history_tokens, the arrays are the ones allocated at the start, the newest
    output is always found, and the first one, long evicted, no longer is."""
    capacity = 2_000
    spec = NgramSpeculator(min_n=2, max_n=4, history_tokens=capacity)
    allocated = spec.history.index.nbytes
    arrays = spec.history.index.tokens.ctypes.data, spec.history.index.slots.ctypes.data
    rng = np.random.default_rng(0)
    outputs = [rng.integers(10, 30_000, size=int(size)) for size in rng.integers(50, 3 * capacity, size=60)]
    for output in outputs:
        session = spec.start(np.array([1, 2]))
        session.extend(output)
        session.finish()
        assert spec.history.index.length <= capacity and spec.history.index.nbytes == allocated
        # [..., output, separator]: the 4-gram ending at output[-31] continues at length - 31
        assert spec.history.find(output[-40:-30]) == (4, spec.history.index.length - 31)
    assert spec.history.find(outputs[0][:4]) == (0, -1)
    # Evictions refill the same arrays: their pages were mapped once, at the start.
    assert (spec.history.index.tokens.ctypes.data, spec.history.index.slots.ctypes.data) == arrays
    tiny = NgramSpeculator(min_n=1, max_n=2, history_tokens=1)  # room for a separator only
    for output in outputs[:3]:
        tiny.history.add(output)
        assert tiny.history.index.length <= 1


def test_a_recurring_edit_is_drafted_where_the_copied_prompt_repeats_it():
    # The prompt holds 7 twice; the output copies it, writes 8 for the first 7 and copies on.
    prompt = [1, 10, 11, 7, 12, 13, 14, 15, 16, 7, 17, 18, 19, 2, 10, 11]
    on = session_of(prompt, min_n=1, max_draft_tokens=6, edit_recurrence=True)
    off = session_of(prompt, min_n=1, max_draft_tokens=6, edit_recurrence=False)
    for s in (on, off):
        assert s.propose().tokens.tolist() == [7, 12, 13, 14, 15, 16]
        s.extend([8])  # the edit: 8 where the prompt holds 7
        assert s.propose().tokens.tolist() == []  # "8" occurs nowhere before
        s.extend([12])
        assert s.propose().tokens.tolist() == [13, 14, 15, 16, 7, 17]  # "12": copying resumes
        s.extend([13, 14])
    assert on.edits == {(7,): (8,)}  # learned when the copy resumed
    assert off.propose().tokens.tolist() == [15, 16, 7, 17, 18, 19]
    assert on.propose().tokens.tolist() == [15, 16, 8, 17, 18, 19]  # the edit recurs in the draft
    on.extend([15, 16, 7])  # the target refuses it here
    assert on.edits == {}


def test_edits_recur_through_a_renamed_text():
    """A text whose output renames one 2-token name to a 1-token one throughout (the edit
    recurs 40 times): with edit recurrence drafts carry the new name, and greedy decoding
    needs under half the verify passes (replay counts them exactly)."""
    from ngramspec.draft.replay import replay

    rng = np.random.default_rng(0)
    old, new = [7, 9], [8]
    prompt, output = [1, 2, 3], []
    for _ in range(20):  # lines: 12 random tokens with the name placed twice
        body = rng.integers(100, 5000, size=12).tolist()
        a, b = sorted(rng.choice(range(1, 12), size=2, replace=False))
        prompt += body[:a] + old + body[a:b] + old + body[b:]
        output += body[:a] + new + body[a:b] + new + body[b:]
    prompt += [4, 5]
    passes = {on: replay(NgramSpeculator(edit_recurrence=on).start(prompt), output).stats.target_forwards
              for on in (False, True)}
    assert passes[True] < 0.5 * passes[False]


@pytest.mark.parametrize("seed", range(3))
def test_edit_recurrence_is_exact(tiny_model, seed):
    """Greedy with edit recurrence equals plain greedy (edits change drafts, never outputs)."""
    rng = np.random.default_rng(seed)
    spec = NgramSpeculator(min_n=1, edit_recurrence=True)
    for _ in range(6):
        phrase = rng.integers(2, 40, size=int(rng.integers(3, 12)))
        edited = phrase.copy()
        edited[int(rng.integers(len(phrase)))] = int(rng.integers(2, 40))
        prompt = np.concatenate([phrase, edited, phrase, rng.integers(2, 40, size=5), phrase])
        ids = torch.tensor([prompt.tolist()])
        max_new = int(rng.integers(5, 80))
        expected = plain_generate(tiny_model, ids, max_new_tokens=max_new)
        got = tiny_model.generate(ids, max_new_tokens=max_new, ngram_speculator=spec)
        assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("capacity", [0, 100_064])
def test_a_session_holds_at_most_32_bytes_per_token_of_random_prompt(capacity):
    """Random text is the worst case (nothing recurs): ~1.3 slots a token at 100k tokens of a
    49k vocabulary (a slot per distinct token, per token whose token recurred, per promotion),
    8 bytes a slot at a load of 0.47-0.7, and 4 bytes a token of stream. The table keeps room for
    what decoding adds at first; the stream is sized to the capacity start() was given, and
    never copied below it."""
    prompt = np.random.default_rng(0).integers(0, 49_152, size=100_000, dtype=np.int32)
    session = NgramSpeculator().start(prompt, capacity)
    table, s = session._table, session._slot

    def arrays():
        return slot_index(table.indexes, s)

    before = arrays()
    assert sum(a.nbytes for a in before) <= 32 * prompt.size + 4 * capacity
    for start in range(0, 64, 2):
        session.propose()
        session.extend(prompt[start : start + 2])
    if capacity:
        assert [a.ctypes.data for a in arrays()] == [a.ctypes.data for a in before]
        assert arrays()[0].size == capacity

