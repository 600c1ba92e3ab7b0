"""Batches: left-padded rows, each accepting its own number of draft tokens, finishing on its own.

Greedy batch output must equal plain batched ``generate`` token for token, and each row must
equal that row decoded alone (float64 tiny models: no near ties).
"""

import numpy as np
import pytest
import torch
from transformers import ClassifierFreeGuidanceLogitsProcessor, LogitsProcessor, LogitsProcessorList

from ngramspec import NgramSpeculator, UnsupportedGenerationError
from ngramspec.draft.proposal import Draft
from ngramspec.draft.tuning import batch_draft_length
from ngramspec.hf.decode import _maybe_compact
from ngramspec.hf.target import left_pad

from conftest import PROCESSOR_CASES, assert_accepted, plain_generate
from test_exact_tiny import _tiny

PAD = 1  # the tiny models' pad (and EOS) id


def repetitive_rows(rng, count, vocab=40, lengths=(1, 50)):
    rows = []
    for _ in range(count):
        length = int(rng.integers(*lengths))
        phrase = rng.integers(2, vocab, size=max(2, length // 3))
        rows.append(np.concatenate([phrase] * 3 + [rng.integers(2, vocab, size=length)])[:length].tolist())
    return rows


def alone(model, row, **kwargs):
    """Row decoded alone with plain greedy, as new tokens (EOS and all)."""
    return plain_generate(model, torch.tensor([row]), **kwargs)[0, len(row) :].tolist()


SETTINGS = [
    dict(min_n=1, verify_cost=((1, 1.0), (512, 1.0))),  # flat cost: every row drafts
    dict(min_n=2, max_draft_tokens=4),  # default CPU cost curve: the batch rule decides
    dict(min_n=1, payoff_sizing=False, max_draft_tokens=16),
]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("setting", range(len(SETTINGS)))
def test_batch_equals_plain_batch_and_each_row_alone(tiny_model, seed, setting):
    rng = np.random.default_rng(seed)
    rows = repetitive_rows(rng, int(rng.integers(2, 7)))
    ids, mask = left_pad(rows, PAD)
    max_new = int(rng.integers(1, 70))
    spec = NgramSpeculator(**SETTINGS[setting])
    got = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=max_new, ngram_speculator=spec)
    expected = plain_generate(tiny_model, ids, attention_mask=mask, max_new_tokens=max_new)
    assert got.tolist() == expected.tolist()
    for b, row in enumerate(rows):
        own = alone(tiny_model, row, max_new_tokens=max_new)  # ends at its EOS, no padding
        assert got[b, ids.shape[1] : ids.shape[1] + len(own)].tolist() == own
        assert spec.last_row_stats[b].new_tokens == len(own)
    assert_accepted(spec)


def test_rows_accept_different_amounts_and_long_runs_compact(tiny_model):
    """Long generation: rows accept different numbers of tokens per step (holes in the shared
    cache) and the cache gets compacted along the way; output still exact."""
    rng = np.random.default_rng(11)
    rows = repetitive_rows(rng, 4, lengths=(5, 60))
    ids, mask = left_pad(rows, PAD)
    spec = NgramSpeculator(min_n=1, verify_cost=((1, 1.0), (512, 1.0)))
    compactions = []
    import ngramspec.hf.decode as batch_module

    original = batch_module._maybe_compact

    def counting(mask, valid, gather):
        assert valid == mask.sum(1).tolist()  # the host-side count agrees with the device mask
        out = original(mask, valid, gather)
        compactions.append(out.shape[1] < mask.shape[1])
        return out

    batch_module._maybe_compact = counting
    try:
        got = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=200, eos_token_id=None,
                                  ngram_speculator=spec)
    finally:
        batch_module._maybe_compact = original
    expected = plain_generate(tiny_model, ids, attention_mask=mask, max_new_tokens=200, eos_token_id=None)
    assert got.tolist() == expected.tolist()
    assert any(compactions), "the cache was never compacted: the test does not cover compaction"
    per_step = [s.accepted_per_step for s in spec.last_row_stats]
    assert any(len(set(step)) > 1 for step in zip(*per_step)), "rows always accepted alike"
    assert all(s.mat > 1.2 for s in spec.last_row_stats)


def test_row_that_ends_immediately(tiny_model):
    rows = repetitive_rows(np.random.default_rng(3), 3, lengths=(10, 30))
    first = alone(tiny_model, rows[1], max_new_tokens=1)[0]
    ids, mask = left_pad(rows, PAD)
    kwargs = dict(attention_mask=mask, max_new_tokens=40, eos_token_id=[PAD, first])
    spec = NgramSpeculator(min_n=1)
    got = tiny_model.generate(ids, ngram_speculator=spec, **kwargs)
    assert got.tolist() == plain_generate(tiny_model, ids, **kwargs).tolist()
    assert spec.last_row_stats[1].new_tokens == 1 and spec.last_row_stats[1].stop_reason == "eos"
    assert spec.last_row_stats[1].target_forwards == 1  # left the batch after the prefill
    assert_accepted([spec.last_row_stats[0], spec.last_row_stats[2]])  # the rows that went on drafted


class BanAfterTwo(LogitsProcessor):
    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[input_ids[:, -1] == 2, 4] = -float("inf")
        return scores


@pytest.mark.parametrize(
    "processor_kwargs", PROCESSOR_CASES + [dict(logits_processor=LogitsProcessorList([BanAfterTwo()]))]
)
def test_batch_processors_see_each_rows_prefix(tiny_model, processor_kwargs, verify_mode):
    rows = repetitive_rows(np.random.default_rng(5), 4, lengths=(3, 40))
    ids, mask = left_pad(rows, PAD)
    spec = NgramSpeculator(min_n=1, verify_cost=((1, 1.0), (512, 1.0)))
    got = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=50, ngram_speculator=spec, **processor_kwargs)
    expected = plain_generate(tiny_model, ids, attention_mask=mask, max_new_tokens=50, **processor_kwargs)
    assert got.tolist() == expected.tolist()
    assert sum(s.drafted_tokens for s in spec.last_row_stats) > 20
    if processor_kwargs.get("no_repeat_ngram_size") == 2:
        # Every draft continues a copied n-gram: its first token repeats the bigram (last token,
        # next token) that the processor bans, so none can be accepted. Drafts are still verified.
        assert spec.last_stats.accepted_tokens == 0
    else:
        assert_accepted(spec, at_least=10)


def test_batch_scores_and_logits_match_plain(tiny_model, verify_mode):
    rows = repetitive_rows(np.random.default_rng(8), 3, lengths=(5, 30))
    ids, mask = left_pad(rows, PAD)
    kwargs = dict(attention_mask=mask, max_new_tokens=30, return_dict_in_generate=True, output_scores=True,
                  output_logits=True, repetition_penalty=1.2)
    expected = plain_generate(tiny_model, ids, **kwargs)
    spec = NgramSpeculator(min_n=1)
    got = tiny_model.generate(ids, ngram_speculator=spec, **kwargs)
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert_accepted(spec)
    assert len(got.scores) == len(expected.scores) == len(got.logits)
    new = expected.sequences[:, ids.shape[1] :]
    for i, (ours, theirs) in enumerate(zip(got.scores, expected.scores)):
        live = [b for b in range(len(rows)) if PAD not in new[b, :i].tolist()]  # rows not yet finished
        torch.testing.assert_close(ours[live], theirs[live].to(ours.dtype), rtol=1e-9, atol=1e-9)
        done = [b for b in range(len(rows)) if b not in live]
        assert all(int(ours[b].argmax()) == PAD and ours[b].isinf().sum() == ours.shape[1] - 1 for b in done)
    for i, (ours, theirs) in enumerate(zip(got.logits, expected.logits)):
        live = [b for b in range(len(rows)) if PAD not in new[b, :i].tolist()]
        torch.testing.assert_close(ours[live], theirs[live].to(ours.dtype), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch", ["mistral-sliding-window", "gpt2", "qwen2"])
def test_other_architectures_in_a_batch(arch):
    """GPT-2 (learned positions) and Qwen2 share one cache with holes; a sliding-window cache
    cannot hold per-row holes, so its rows are decoded one by one. All exact."""
    model = _tiny(arch)
    rows = repetitive_rows(np.random.default_rng(2), 3, lengths=(5, 30))
    ids, mask = left_pad(rows, PAD)
    spec = NgramSpeculator(min_n=1, verify_cost=((1, 1.0), (512, 1.0)))
    kwargs = dict(attention_mask=mask, max_new_tokens=60, pad_token_id=PAD, eos_token_id=PAD)
    got = model.generate(ids, ngram_speculator=spec, **kwargs)
    assert got.tolist() == plain_generate(model, ids, **kwargs).tolist()
    assert_accepted(spec, at_least=10)


def test_greedy_num_return_sequences_is_refused(tiny_model):
    """As by plain generate(): greedy copies would be identical."""
    with pytest.raises(ValueError, match="num_return_sequences"):
        tiny_model.generate(torch.tensor([[5, 6, 7]]), num_return_sequences=2, ngram_speculator=NgramSpeculator())


def test_batch_streamer_and_batch_state_processor_are_refused(tiny_model):
    ids, mask = left_pad([[5, 6, 7], [8, 9]], PAD)

    class Sink:
        def put(self, value): ...
        def end(self): ...

    with pytest.raises(UnsupportedGenerationError, match="Streamers take one sequence"):
        tiny_model.generate(ids, attention_mask=mask, streamer=Sink(), ngram_speculator=NgramSpeculator())
    with pytest.raises(UnsupportedGenerationError, match="ClassifierFreeGuidanceLogitsProcessor keeps state"):
        tiny_model.generate(ids, attention_mask=mask, ngram_speculator=NgramSpeculator(),
                            logits_processor=LogitsProcessorList([ClassifierFreeGuidanceLogitsProcessor(1.5)]))


def test_prefix_constrained_rows_get_their_own_batch_index(tiny_model):
    rows = repetitive_rows(np.random.default_rng(4), 3, lengths=(5, 30))
    ids, mask = left_pad(rows, PAD)

    def allowed(batch_id, sentence):  # depends on the row: rows draw from different token sets
        return list(range(2 + 3 * batch_id, 12 + 3 * batch_id)) if int(sentence[-1]) % 2 else list(range(2, 40))

    kwargs = dict(attention_mask=mask, max_new_tokens=40, prefix_allowed_tokens_fn=allowed)
    spec = NgramSpeculator(min_n=1)
    got = tiny_model.generate(ids, ngram_speculator=spec, **kwargs)
    assert got.tolist() == plain_generate(tiny_model, ids, **kwargs).tolist()
    assert_accepted(spec)


def test_batch_draft_length_rule():
    def draft(k, r):
        return Draft(np.arange(k, dtype=np.int32), acceptance=np.full(k, r))

    flat = lambda n: 1.0  # noqa: E731  verifying costs nothing extra: draft everything
    assert batch_draft_length([draft(3, 0.5), draft(7, 0.1)], flat) == 7
    linear = lambda n: float(n)  # noqa: E731  every position costs a full token: never draft
    assert batch_draft_length([draft(3, 0.99), draft(7, 0.99)], linear) == 0
    # Cost doubles from 1 to 2 positions per row, then stays: only very reliable rows pay.
    step = lambda n, rows=4: 1.0 if n <= rows else 2.0  # noqa: E731
    assert batch_draft_length([draft(5, 0.2)] * 4, step) == 0
    assert batch_draft_length([draft(5, 0.9)] * 4, step) == 5
    assert batch_draft_length([draft(0, 0.9)] * 4, step) == 0  # nothing to draft
    assert batch_draft_length([draft(4, 0.2), draft(6, 0.1)], None) == 6  # sizing off: longest


def test_compaction_keeps_each_rows_valid_columns_in_order():
    mask = torch.tensor([[0, 0, 1, 1, 0, 1] + [1, 0] * 40, [1] * 6 + [0, 0] * 40])
    seen = {}

    def gather(rows, columns):
        seen["rows"], seen["columns"] = rows, columns

    new_mask = _maybe_compact(mask, mask.sum(1).tolist(), gather)
    width = int(mask.sum(1).max())
    assert new_mask.shape == (2, width) and seen["rows"] is None
    for b in range(2):
        valid = torch.nonzero(mask[b]).flatten().tolist()
        assert seen["columns"][b, width - len(valid) :].tolist() == valid
        assert new_mask[b].tolist() == [0] * (width - len(valid)) + [1] * len(valid)
    small = torch.ones((2, 10), dtype=torch.long)
    assert _maybe_compact(small, [10, 10], gather) is small  # too few holes: left alone


def test_batch_draft_length_takes_drafts_without_per_position_estimates():
    """A custom session's Draft may carry no estimates (each position counts as 0: no K pays)
    or one rate for every position (a scalar, as before per-position estimates)."""
    flat = lambda n: 1.0 + 0.01 * n  # noqa: E731  nearly free positions
    assert batch_draft_length([Draft(np.arange(4, dtype=np.int32))], flat) == 0
    assert batch_draft_length([Draft(np.arange(4, dtype=np.int32), acceptance=0.9)], flat) == 4
