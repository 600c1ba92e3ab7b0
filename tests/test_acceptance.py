"""The per-position acceptance estimate (ngramspec.draft.acceptance): its kernels pinned to their
plain-Python references, its worked example, and what it must learn."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngramspec import NgramSpeculator
from ngramspec.draft.acceptance import (
    ACCEPTED,
    BUCKETS,
    CALIBRATION,
    CONTESTED,
    HISTORY,
    KEPT,
    MATCH_CAP,
    OWN,
    PREDICTED,
    REJECTED,
    SOURCES,
    bucket,
    fade,
    learn,
    match_length,
    new_evidence,
    position_acceptance,
)
from ngramspec.draft.config import DraftTuning

from reference_acceptance import (
    bucket_reference,
    fade_reference,
    learn_reference,
    match_length_reference,
    position_acceptance_reference,
)

WEIGHTS = (DraftTuning().request_weight, DraftTuning().pool_prior_weight, DraftTuning().calibration_weight)  # default
POOL_WINDOW = DraftTuning().pool_window

counts = st.tuples(st.lists(st.floats(0.0, 5000.0), min_size=2 * SOURCES * BUCKETS, max_size=2 * SOURCES * BUCKETS),
                   st.lists(st.floats(0.0, 1.0), min_size=SOURCES * BUCKETS, max_size=SOURCES * BUCKETS),
                   st.tuples(st.floats(0.0, 50.0), st.floats(0.0, 50.0), st.floats(0.0, 1.0))).map(
    lambda c: np.array(c[0] + c[1] + list(c[2]) + [0.0] * (SOURCES * BUCKETS - 3)).reshape(4, SOURCES * BUCKETS))
# rows: accepted, rejected, doubt; calibration (kept, predicted, pending prediction)
sources = st.sampled_from([OWN, HISTORY, CONTESTED])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000))
def test_bucket_matches_its_reference(match):
    assert bucket(match) == bucket_reference(match)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=2, max_size=150), st.data())
def test_match_length_matches_its_reference(tokens, data):
    stream = np.array(tokens, dtype=np.int32)
    length = data.draw(st.integers(1, len(tokens)))
    start = data.draw(st.integers(0, length - 1))
    assert match_length(stream, length, start) == match_length_reference(stream, length, start)


def test_match_length_stops_at_the_cap_and_at_the_first_difference():
    stream = np.array([1] * 200, dtype=np.int32)
    assert match_length(stream, 200, 150) == MATCH_CAP
    stream = np.array([9, 4, 5, 6, 7, 3, 4, 5, 6, 7], dtype=np.int32)
    assert match_length(stream, 10, 5) == 4  # "4 5 6 7" before position 5 and at the end


@settings(max_examples=300, deadline=None)
@given(counts, counts, st.floats(0.01, 0.99), sources, st.integers(0, 200), st.integers(0, 40),
       st.sampled_from([0.0, 1.0, WEIGHTS[2]]))
def test_position_acceptance_matches_its_reference(own, pool, prior, source, match, k, calibration_weight):
    out, own_ref = np.zeros(k), own.copy()
    position_acceptance(own, pool, prior, source, match, out, *WEIGHTS[:2], calibration_weight)
    want = position_acceptance_reference(own_ref, pool, prior, source, match, k, calibration_weight)
    assert out.tolist() == pytest.approx(want, rel=1e-12)
    assert np.allclose(own, own_ref, rtol=1e-12, atol=0)  # the first position's prediction, kept


@settings(max_examples=300, deadline=None)
@given(counts, counts, sources, st.integers(0, 200), st.integers(0, 30), st.integers(0, 30))
def test_learn_matches_its_reference(own, pool, source, match, kept, extra):
    own_ref, pool_ref = own.copy(), pool.copy()
    learn(own, pool, source, match, kept, kept + extra, POOL_WINDOW)
    learn_reference(own_ref, pool_ref, source, match, kept, kept + extra)
    assert own.tolist() == own_ref.tolist() and pool.tolist() == pool_ref.tolist()


@settings(max_examples=200, deadline=None)
@given(counts, sources, st.integers(0, 200), st.floats(0.0, 1.0))
def test_fade_matches_its_reference(own, source, match, memory):
    own_ref = own.copy()
    fade(own, source, match, memory)
    fade_reference(own_ref, source, match, memory)
    assert np.allclose(own, own_ref, rtol=1e-12, atol=0)


def test_the_worked_example_from_the_docstring():
    own, pool = new_evidence(), new_evidence()
    pool[:2, 1] = (1, 3)
    pool[:2, 2] = (6, 2)
    out = np.zeros(8)
    position_acceptance(own, pool, 0.5, OWN, 1, out, *WEIGHTS)
    estimates = [1 / 3, 22 / 30, 22 / 30, 0.8, 0.8, 0.8, 0.8, 8 / 9]
    assert out.tolist() == pytest.approx(estimates)
    position_acceptance(own, pool, 0.5, HISTORY, 1, out, *WEIGHTS)
    assert out.tolist() == pytest.approx([0.5, 2 / 3, 2 / 3, 0.8, 0.8, 0.8, 0.8, 8 / 9])  # its own evidence


def test_a_long_match_is_trusted_further_than_a_short_one():
    """After drafts from 1-token matches broke at their first token while copies through long
    matches held, a new request (only the pool) estimates a 1-token match's first position
    low, and each position along it higher as the match it continues grows."""
    own, pool = new_evidence(), new_evidence()
    for _ in range(30):
        learn(own, pool, OWN, 1, 0, 4, POOL_WINDOW)  # a 1-token match, refused at once
        learn(own, pool, OWN, 2, 6, 8, POOL_WINDOW)  # a 2-token match, kept for 6 positions, then refused
        learn(own, pool, OWN, 40, 8, 8, POOL_WINDOW)  # a long copy, all kept
    out = np.zeros(6)
    position_acceptance(new_evidence(), pool, 0.5, OWN, 1, out, *WEIGHTS)
    assert out[0] < 0.1 and out[1] > 0.6 and out[3] > out[1] and out[5] > 0.8
    long = np.zeros(1)
    position_acceptance(new_evidence(), pool, 0.5, OWN, 40, long, *WEIGHTS)
    assert long[0] > 0.95


def test_the_pool_forgets_past_its_window_and_a_declined_bucket_fades_back_to_the_prior():
    own, pool = new_evidence(), new_evidence()
    for _ in range(int(POOL_WINDOW) + 10):
        learn(own, pool, OWN, 1, 0, 1, POOL_WINDOW)
    assert pool[:2, 1].sum() <= POOL_WINDOW  # halved: a workload that changes is followed
    pool_before = pool.copy()
    for _ in range(200):
        fade(own, OWN, 1, 0.9)
    assert pool.tolist() == pool_before.tolist()  # declines fade the request, never the pool
    out = np.zeros(1)
    position_acceptance(own, pool, 0.5, OWN, 1, out, *WEIGHTS)
    assert out[0] == pytest.approx(0.5, abs=0.01)  # back to the prior: the request tries again
    learn(own, pool, OWN, 1, 1, 2, POOL_WINDOW)  # a verified draft: the pool speaks again
    position_acceptance(own, pool, 0.5, OWN, 1, out, *WEIGHTS)
    assert out[0] < 0.3


def test_a_request_whose_first_positions_fail_more_than_predicted_is_estimated_lower_in_every_bucket():
    """Calibration (module doc): six drafts after 1-token matches, each refused at once where
    the pool predicted p, scale what the request borrows in every bucket by (0 + 4) / (6p + 4)
    (calibration_weight 4), buckets it has no evidence of included; a request that kept every
    first position is not raised above the pool; declines fade the calibration back; weight 0
    turns it off."""
    pool = new_evidence()
    pool[ACCEPTED, :BUCKETS], pool[REJECTED, :BUCKETS] = 60.0, 20.0  # the pool's requests copied: ~0.75
    fresh, refused, kept = np.zeros(1), new_evidence(), new_evidence()
    position_acceptance(new_evidence(), pool, 0.5, OWN, 8, fresh, *WEIGHTS)
    out = np.zeros(4)
    for _ in range(6):
        for own, outcome in ((refused, 0), (kept, 4)):
            position_acceptance(own, pool, 0.5, OWN, 1, out, *WEIGHTS)
            learn(own, pool.copy(), OWN, 1, outcome, 4, POOL_WINDOW)  # the pool as it was
    predicted = refused[CALIBRATION, PREDICTED]
    assert refused[CALIBRATION, KEPT] == 0 and predicted == pytest.approx(6 * fresh[0], rel=0.05)
    after = np.zeros(1)
    position_acceptance(refused, pool, 0.5, OWN, 8, after, *WEIGHTS)  # bucket 4: no own evidence there
    assert after[0] == pytest.approx(fresh[0] * 4 / (predicted + 4), rel=1e-9) and after[0] < 0.4 < 0.7 < fresh[0]
    position_acceptance(kept, pool, 0.5, OWN, 8, after, *WEIGHTS)
    assert after[0] == pytest.approx(fresh[0], rel=1e-9)  # never raised: only its own buckets speak up
    for _ in range(300):
        fade(refused, OWN, 1, 0.97)
    position_acceptance(refused, pool, 0.5, OWN, 8, after, *WEIGHTS)
    assert after[0] == pytest.approx(fresh[0], rel=0.01)  # faded back: the request tries again
    refused[CALIBRATION, PREDICTED] = 100.0
    position_acceptance(refused, pool, 0.5, OWN, 8, after, *WEIGHTS[:2], 0.0)
    assert after[0] == fresh[0]  # weight 0: the pool as it is


def test_requests_of_one_speculator_share_the_pool():
    """What one request learned, the next one starts from; another speculator does not."""
    spec = NgramSpeculator(min_n=1, max_n=2, copy_cursor=False, fuzzy_resync=False, payoff_sizing=False)
    text = np.array([1, 2, 3, 4, 1, 2], dtype=np.int32)
    first = spec.start(text)
    draft = first.propose(max_tokens=2)
    assert draft.tokens.tolist() == [3, 4] and draft.acceptance.tolist() == pytest.approx([2 / 3, 2 / 3])
    first.extend([7])  # refused at its first position (a 2-token match: prior 2/3)
    second = spec.start(text)
    assert second.propose(max_tokens=2).acceptance[0] < 0.6
    assert NgramSpeculator(spec.config).start(text).propose(max_tokens=2).acceptance[0] == pytest.approx(2 / 3)


def test_a_contested_match_learns_apart_from_an_uncontested_one():
    """After "... 5 6 ... 5 8 ... 5" the text went two ways after "5" (the index's earliest and
    latest occurrences continue 6 and 8): a copy from there is CONTESTED and is estimated from
    that source's evidence; after "... 5 6 ... 5 6 ... 5" it is OWN."""
    spec = NgramSpeculator(min_n=1, max_n=1, max_draft_tokens=3, payoff_sizing=False)
    for c in range(CONTESTED * BUCKETS, (CONTESTED + 1) * BUCKETS):
        spec.pool[REJECTED, c] = 100.0  # contested copies have always failed here
    contested = spec.start([5, 6, 7, 5, 8, 9, 5]).propose()
    uncontested = spec.start([5, 6, 7, 5, 6, 9, 5]).propose()
    assert contested.tokens.tolist() == [8, 9, 5] and uncontested.tokens.tolist() == [6, 9, 5]
    assert contested.acceptance[0] < 0.05 < 0.5 <= uncontested.acceptance[0]
