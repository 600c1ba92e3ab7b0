"""`python -m eval selfspec`'s arithmetic: the stated copy rule, the exact drafting replay and
the layer sets it measures (no model)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from eval.selfspec import copy_predictions, expected_tokens, layer_sets, replay_tokens_per_cycle


def test_copy_rule_takes_the_longest_suffix_at_its_latest_occurrence():
    #        0  1  2  3  4  5  6  7
    text = [5, 6, 7, 5, 8, 5, 6, 9]
    # g=3: suffix [7] never seen before -> no match; g=4: [5] seen at 0 -> 6 (wrong, 8 follows);
    # g=5: [5, 8]? no; [8]? no -> -1; g=6: [8, 5]? no; [5] latest earlier at 3 -> 8;
    # g=7: [5, 6] at 0 -> 7 (the longest suffix wins over [6]).
    assert copy_predictions(text, 3).tolist() == [-1, 6, -1, 8, 7]


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_replay_of_perfect_and_hopeless_drafters(gamma):
    n = 40
    assert replay_tokens_per_cycle(np.zeros(n, bool), gamma) == 1.0  # every step emits the target's token alone
    perfect = replay_tokens_per_cycle(np.ones(n, bool), gamma)
    assert gamma < perfect <= gamma + 1  # all drafts accepted, the last cycle shorter


def test_replay_counts_runs():
    # agreements T T F | T ...: with gamma 2 the first cycle accepts 2 and emits 3 tokens
    agree = np.array([True, True, False, True, False, False])
    assert replay_tokens_per_cycle(agree, 2) == pytest.approx(6 / 3)  # cycles emit 3, 2, 1


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 3) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)


def test_layer_sets_parse_depths_and_skips():
    args = SimpleNamespace(depths="4,30,40", skips="4+4,6+6/2")
    sets = layer_sets(args, 30)
    assert sets["first 4"] == (0, 1, 2, 3) and "first 30" not in sets  # a depth of all layers is the target
    assert sets["skip 22 mid (4+4)"] == (0, 1, 2, 3, 26, 27, 28, 29)
    kept = sets["skip 9 mid (6+6/2)"]
    assert len(kept) == 21 and kept[6:9] == (6, 8, 10)
