"""Session API: propose copies the continuation of the longest earlier match; replay counts."""

import pytest

from ngramspec import Draft, NgramSpeculator
from ngramspec.draft.replay import ForwardCost, replay


def test_propose_copies_the_continuation():
    spec = NgramSpeculator(min_n=1, max_n=3, max_draft_tokens=4, payoff_sizing=False)
    session = spec.start([10, 11, 12, 13, 14, 15, 10, 11])
    draft = session.propose()
    assert isinstance(draft, Draft) and draft.parents is None
    assert draft.tokens.tolist() == [12, 13, 14, 15] and draft.match_len == 2 and draft.source_start == 2
    assert session.propose(max_tokens=2).tokens.tolist() == [12, 13]
    assert len(session.propose(max_tokens=0)) == 0
    session.extend([12, 99])  # the target diverged after one accepted token
    assert len(session.propose()) == 0  # 99 never occurred before
    assert session.tokens.tolist() == [10, 11, 12, 13, 14, 15, 10, 11, 12, 99]


def test_draft_continues_a_period_past_the_end_of_stream():
    # "7 8 7": the suffix "7" last occurred at 0, followed by "8 7" = the suffix itself, so
    # the text repeats with period 2 and the draft continues that period.
    session = NgramSpeculator(min_n=1, max_draft_tokens=5, payoff_sizing=False).start([7, 8, 7])
    assert session.propose().tokens.tolist() == [8, 7, 8, 7, 8]
    session = NgramSpeculator(min_n=2, max_draft_tokens=4, payoff_sizing=False).start([3, 3, 3])
    assert session.propose().tokens.tolist() == [3, 3, 3, 3]


def test_payoff_sizing_learns_from_rejections():
    # A long repeated pattern whose continuation the "target" never follows: after a few
    # rejected drafts, drafting stops paying and the session proposes nothing, but for a probe
    # where a match of another length (its own evidence bucket) comes up.
    cost = ((1, 1.0), (2, 1.5), (16, 1.5))
    spec = NgramSpeculator(min_n=2, max_draft_tokens=8, verify_cost=cost)
    session = spec.start([1, 2, 3, 4, 5, 6, 7, 8, 9] * 2)
    sizes = []
    for i in range(8):
        session.extend([1, 2])  # suffix "1 2" matches (n=2): a draft copies what followed it
        draft = session.propose()
        sizes.append(len(draft))
        session.extend([100 + i])  # the target emits a new token: the first draft token fails
    assert sizes[0] > 0 and sum(size > 0 for size in sizes[4:]) <= 1, sizes
    # ...while a target that accepts everything keeps the drafts at full length.
    session = spec.start([1, 2, 3, 4, 5, 6, 7, 8, 9] * 2)
    session.extend([1, 2])
    for _ in range(5):
        draft = session.propose()
        assert len(draft) > 0
        session.extend(draft.tokens.tolist() + [int(draft.tokens[-1]) % 9 + 1])
    assert len(session.propose()) == 8


def test_payoff_sizing_prefers_no_draft_when_verify_is_expensive():
    spec = NgramSpeculator(verify_cost=((1, 1.0), (2, 3.0)), acceptance_prior=0.5)
    session = spec.start([1, 2, 3, 1, 2])
    assert len(session.propose()) == 0  # (1 + 0.5 + ...) / 3 < 1
    free = NgramSpeculator(verify_cost=((1, 1.0), (32, 1.0))).start([1, 2, 3, 4, 5, 1, 2])
    cap = free.config.max_draft_tokens
    assert free.propose().tokens.tolist() == ([3, 4, 5, 1, 2] * cap)[:cap]  # free: take the most


def test_session_rejects_bad_ids():
    spec = NgramSpeculator()
    with pytest.raises(ValueError, match="1-D"):
        spec.start([[1, 2]])
    with pytest.raises(TypeError, match="integers"):
        spec.start([1.5, 2.0])


def test_replay_hand_computed():
    # prompt 1 2 3 4 5, greedy output 1 2 3 4 9 1 2 (7 tokens), max_n=2, up to 3 drafted.
    # prefill emits 1                                    forwards 1
    # suffix "5 1"? no; "1" -> drafts 2 3 4, all accepted (+target 9): emits 2 3 4 9   forwards 2
    # suffix "4 9"/"9" unseen -> empty draft, emits 1                                   forwards 3
    # suffix "9 1"? no; "1" -> drafts min(3, remaining-1=0) = nothing, emits 2           forwards 4
    spec = NgramSpeculator(min_n=1, max_n=2, max_draft_tokens=3, payoff_sizing=False)
    result = replay(spec.start([1, 2, 3, 4, 5]), [1, 2, 3, 4, 9, 1, 2], cost=ForwardCost(((1, 1.0), (4, 2.0))))
    s = result.stats
    assert (s.new_tokens, s.target_forwards, s.drafted_tokens, s.accepted_tokens) == (7, 4, 3, 3)
    assert s.mat == pytest.approx(7 / 4)
    assert result.cost == pytest.approx(1 + 2.0 + 1 + 1)
    assert s.acceptance_by_position == [1.0, 1.0, 1.0]


def test_forward_cost_interpolates_and_grows_in_proportion_past_the_last_point():
    cost = ForwardCost(((1, 1.0), (3, 2.0)))
    assert cost(2) == pytest.approx(1.5) and cost(1) == 1.0 and cost(12) == pytest.approx(8.0)
