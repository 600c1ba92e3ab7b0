"""Replay with the target in the loop (eval/target.py): what the drafters see of the target, the
two leads, and their report."""

import json

import numpy as np
import pytest
import torch

from eval import target
from eval.replay import replay_all
from ngramspec import NgramSpeculator
from ngramspec.cost.curves import DEFAULT_CPU_CURVE

from conftest import call_main, tiny_llama


def _traces(count=6, seed=0):
    """Prompts with repeated spans, outputs that copy them with edits (vocabulary of 40)."""
    rng = np.random.default_rng(seed)
    traces = []
    for n in range(count):
        span = rng.integers(2, 40, 12).tolist()
        prompt = rng.integers(2, 40, 8).tolist() + span + rng.integers(2, 40, 6).tolist() + span
        output = span[:5] + [int(rng.integers(2, 40))] + span[6:] + span[:7]
        traces.append({"id": f"t{n}", "dataset": "jfleg", "prompt_ids": prompt, "output_ids": output})
    return traces


def test_capture_gives_each_position_the_targets_state_top_probability_and_argmax(tmp_path):
    model = tiny_llama()
    traces = _traces(2)
    views = target.capture(model, traces, cache=tmp_path / "states.npz", quiet=True)
    ids = torch.tensor([traces[1]["prompt_ids"] + traces[1]["output_ids"]])
    with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0].float(), -1)
    view = views[1]
    assert view.states.shape == (ids.shape[1], target.DIMS) and view.states.dtype == np.float16
    assert np.allclose(np.linalg.norm(view.states.astype(np.float32), axis=1), 1.0, atol=2e-3)
    assert np.array_equal(view.argmax, probs.argmax(-1).numpy())
    assert np.allclose(view.top, probs.max(-1).values.numpy(), atol=1e-6)

    class NoModel:  # the cache answers: the model is not run again
        def __call__(self, *args, **kwargs):
            raise AssertionError("ran the model although the cache holds the features")

    again = target.capture(NoModel(), traces, cache=tmp_path / "states.npz", quiet=True)
    assert all(np.array_equal(a.states, b.states) and np.array_equal(a.argmax, b.argmax) for a, b in zip(views, again))


def _view(length, rng):
    states = rng.standard_normal((length, target.DIMS)).astype(np.float32)
    states /= np.linalg.norm(states, axis=1, keepdims=True)
    return target.TargetView(states.astype(np.float16), np.full(length, 0.5, np.float32), np.zeros(length, np.int32))


@pytest.mark.parametrize("closest, expected", [(0, 3), (4, 4)])
def test_source_lead_copies_the_occurrence_whose_state_is_closest(closest, expected):
    """Stream "5 1 2 3 9 1 2 4 7 8 1": both "1"s match the last token alone; the state before
    the last "1" (position 9) is made equal to the one before the first "1" (position 0) or the
    second (position 4), and the draft continues "2 3" or "2 4" accordingly (the copy
    statistics alone take the most recent: "2 4")."""
    stream = [5, 1, 2, 3, 9, 1, 2, 4, 7, 8, 1]
    view = _view(len(stream), np.random.default_rng(0))
    view.states[9] = view.states[closest]
    spec = NgramSpeculator(verify_cost=DEFAULT_CPU_CURVE.points, copy_cursor=False, fuzzy_resync=False)
    session = target.TargetAwareSession(target.reference_session(spec, stream), view, ("source",), None)
    draft = session.propose(max_tokens=4, sized=False)
    assert draft.tokens[:2].tolist() == [2, expected]
    assert spec.start(stream).propose(max_tokens=4, sized=False).tokens[:2].tolist() == [2, 4]


def test_acceptance_lead_before_learning_sizes_exactly_as_the_copy_statistics(monkeypatch):
    """Its weights start at the copy estimate's: until the first refit the replay is today's,
    to the digit; once it refits, the drafts change."""
    traces = _traces()
    rng = np.random.default_rng(1)
    views = [_view(len(t["prompt_ids"]) + len(t["output_ids"]), rng) for t in traces]
    monkeypatch.setattr(target, "REFIT_EVERY", 10**9)
    learned = {}
    results = replay_all(traces, ["ngramspec", "ngramspec+acceptance"], DEFAULT_CPU_CURVE, views=views, learned=learned)
    strip = {k: v for k, v in results["ngramspec"]["overall"].items() if k != "drafter_us_per_step"}
    assert strip == {k: v for k, v in results["ngramspec+acceptance"]["overall"].items() if k in strip}
    scored = learned["ngramspec+acceptance"].scored
    assert scored and all(abs(p - min(max(e, 1e-4), 1 - 1e-4)) < 1e-9 for p, e, *_ in scored)
    monkeypatch.setattr(target, "REFIT_EVERY", 8)
    refit = replay_all(traces, ["ngramspec+acceptance"], DEFAULT_CPU_CURVE, views=views, learned=learned)
    assert not np.array_equal(learned["ngramspec+acceptance"].weights, [0, 1] + [0] * 8)
    after = refit["ngramspec+acceptance"]["overall"]
    assert (after["speedup"], after["mean_draft"]) != (strip["speedup"], strip["mean_draft"])


def test_stratified_auc_counts_only_pairs_of_the_same_depth_and_match():
    rng = np.random.default_rng(2)
    for _ in range(20):
        rows = [(float(rng.integers(0, 5)), 0.0, float(rng.integers(0, 2)), int(rng.integers(0, 3)),
                 int(rng.integers(1, 12))) for _ in range(40)]
        hits = pairs = 0.0
        for a in rows:
            for b in rows:
                if a[2] == 1 and b[2] == 0 and a[3] == b[3] and min(a[4], 8) == min(b[4], 8):
                    pairs += 1
                    hits += 1.0 if a[0] > b[0] else 0.5 if a[0] == b[0] else 0.0
        assert target.stratified_auc(rows, 0) == pytest.approx(hits / pairs)


def test_target_aware_methods_need_the_model_and_known_leads():
    with pytest.raises(ValueError, match="give --model"):
        replay_all(_traces(1), ["ngramspec+source"], DEFAULT_CPU_CURVE)
    with pytest.raises(ValueError, match="LEAD among source, acceptance"):
        target.parse_method("ngramspec+hunch")
    assert target.parse_method("ngramspec+source+acceptance:max_n=4") == ("ngramspec:max_n=4",
                                                                          ("source", "acceptance"))


def test_replay_with_the_model_reports_oracle_shares_and_calibration(tiny_model_dir, tmp_path, capsys):
    from eval.__main__ import main

    traces = tmp_path / "traces.jsonl"
    traces.write_text("".join(json.dumps(t) + "\n" for t in _traces()))
    code, stdout, err = call_main(main, ["replay", str(traces), "--model", str(tiny_model_dir), "--quiet", "--methods",
                                         "ngramspec,ngramspec+source+acceptance,oracle", "--out", str(tmp_path / "r")],
                                  capsys)
    assert code == 0, err[-2000:]
    text = (tmp_path / "r.md").read_text()
    assert "| ngramspec+source+acceptance |" in text and "Share of the oracle's gain" in text
    assert "Ranking AUC within equal depth and match length" in text and "| 10 |" in text
