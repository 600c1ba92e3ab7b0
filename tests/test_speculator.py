"""Session API: propose copies the continuation of the longest earlier match; replay counts."""

import numpy as np
import pytest

from ngramspec import Draft, NgramSpeculator
from ngramspec.replay import ForwardCost, replay


def test_propose_copies_the_continuation():
    spec = NgramSpeculator(min_n=1, max_n=3, max_draft_tokens=4)
    session = spec.start([10, 11, 12, 13, 14, 15, 10, 11])
    draft = session.propose()
    assert isinstance(draft, Draft) and draft.parents is None
    assert draft.tokens.tolist() == [12, 13, 14, 15] and draft.match_len == 2 and draft.source_start == 2
    assert session.propose(max_tokens=2).tokens.tolist() == [12, 13]
    assert len(session.propose(max_tokens=0)) == 0
    session.extend([12, 99])  # the target diverged after one accepted token
    assert len(session.propose()) == 0  # 99 never occurred before
    assert session.tokens.tolist() == [10, 11, 12, 13, 14, 15, 10, 11, 12, 99]


def test_draft_stops_at_end_of_stream():
    session = NgramSpeculator(max_draft_tokens=8).start([7, 8, 7])
    assert session.propose().tokens.tolist() == [8, 7]


def test_draft_length_follows_match_length():
    spec = NgramSpeculator(min_n=1, max_n=4, max_draft_tokens=8, draft_tokens_per_match_token=1)
    session = spec.start([1, 2, 3, 4, 5, 6, 7, 8, 9, 3])
    assert session.propose().tokens.tolist() == [4]  # 1-token match: one token drafted
    session.extend([4, 5])
    assert session.propose().tokens.tolist() == [6, 7, 8]  # 3-token match (3 4 5)


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
    spec = NgramSpeculator(min_n=1, max_n=2, max_draft_tokens=3)
    result = replay(spec.start([1, 2, 3, 4, 5]), [1, 2, 3, 4, 9, 1, 2], cost=ForwardCost(((1, 1.0), (4, 2.0))))
    s = result.stats
    assert (s.new_tokens, s.target_forwards, s.drafted_tokens, s.accepted_tokens) == (7, 4, 3, 3)
    assert s.mat == pytest.approx(7 / 4)
    assert result.cost == pytest.approx(1 + 2.0 + 1 + 1)
    assert s.acceptance_by_position == [1.0, 1.0, 1.0]


def test_forward_cost_interpolates():
    cost = ForwardCost(((1, 1.0), (3, 2.0)))
    assert cost(2) == pytest.approx(1.5) and cost(1) == 1.0 and cost(10) == 2.0
