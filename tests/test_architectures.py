"""One representative per cache kind, built from its own transformers config (eval/tiny_models.py):
greedy output identical to plain greedy, for one row and a left-padded batch of 2, with drafts
accepted and partly rejected (an identical output with no accepted draft proves nothing). The
full sweep over every registered type is `python -m eval compat` (eval/results/compat).
"""

import warnings

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from eval.compat import prompts
from eval.tiny_models import tiny_model
from ngramspec import InexactPrecisionWarning, NgramSpeculator, UnsupportedGenerationError

from conftest import plain_generate

NEW = 24

# model type -> config overrides; each a cache kind generate() builds differently.
KINDS = {
    "llama": {},  # full attention, DynamicLayer
    "mistral": {"sliding_window": 8},  # sliding window only, shorter than the prompt
    "gemma3_text": {"sliding_window": 8},  # sliding and full layers
    "qwen3_next": {},  # hybrid: linear attention (conv + recurrent states) and full attention
    "qwen2_moe": {},  # mixture of experts
    "deepseek_v3": {},  # multi-head latent attention
    "mamba": {},  # a state-space model: recurrent states only
    "zaya": {},  # hybrid whose recurrent layers record only the state before a forward: replayed
}


# Kernels with no float64 path (grouped expert matmuls, gated delta rule): float32, where the
# sharpened weights keep logit gaps far above the ~1e-5 a multi-token forward moves them.
FLOAT32 = {"qwen3_next", "qwen2_moe", "zaya"}


def _model(model_type: str, **overrides):
    dtype = torch.float32 if model_type in FLOAT32 else torch.float64
    model = tiny_model(model_type, dtype=dtype, seed=3, **overrides)
    with torch.no_grad():  # sharper random weights: varied output, few near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
        for name, p in model.named_parameters():
            if name.endswith(("dt_proj_bias", "dt_proj.bias", "dt_bias")):
                # State-space step sizes of about 1 (random init gives ~0.01): the recurrent
                # state then carries each token, so a wrong rollback changes the output.
                p.fill_(0.5)
    return model


def _greedy(model, ids, **kwargs):
    return dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, eos_token_id=None,
                pad_token_id=0, **kwargs)


@pytest.mark.parametrize("model_type", list(KINDS))
def test_one_row_is_identical_with_drafts_accepted_and_rolled_back(model_type):
    model = _model(model_type, **KINDS[model_type])
    ids, _ = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    expected = plain_generate(model, ids, **_greedy(model, ids))
    got = model.generate(ids, ngram_speculator=spec, **_greedy(model, ids))
    assert got.tolist() == expected.tolist()
    stats = spec.last_stats
    rollbacks = sum(a < d for a, d in zip(stats.accepted_per_step, stats.verified_per_step))
    assert stats.accepted_tokens > 0 and rollbacks > 0, stats


@pytest.mark.parametrize("model_type", list(KINDS))
def test_a_left_padded_batch_is_identical(model_type):
    model = _model(model_type, **KINDS[model_type])
    _, (ids, mask) = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    expected = plain_generate(model, ids, attention_mask=mask, **_greedy(model, ids))
    got = model.generate(ids, attention_mask=mask, ngram_speculator=spec, **_greedy(model, ids))
    assert got.tolist() == expected.tolist()
    assert sum(s.accepted_tokens for s in spec.last_row_stats) > 0


@pytest.mark.parametrize("model_type", ["llama", "qwen3_next", "mamba", "zaya"])
def test_static_cache(model_type):
    model = _model(model_type)
    ids, _ = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    kwargs = _greedy(model, ids, cache_implementation="static")
    expected = plain_generate(model, ids, **kwargs)
    assert model.generate(ids, ngram_speculator=spec, **kwargs).tolist() == expected.tolist()
    assert spec.last_stats.accepted_tokens > 0


class StopAtLength(StoppingCriteria):
    """A user's stopping criterion: every row stops once the sequence has ``length`` tokens."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


@pytest.mark.parametrize("model_type", ["qwen3_next", "mamba", "gemma3_text", "zaya"])
def test_a_cache_returned_after_a_stop_inside_a_draft_is_plain_decodings(model_type):
    """A stopping criterion that fires inside an accepted draft ends the output there (every
    such point of one decode is tried): the tokens past it are rolled back in the same crop as
    the rejected ones, so the returned cache's states are exactly those plain decoding returns
    (a recurrent or sliding-window layer rolls back once per forward). (max_new_tokens never
    ends inside a draft: drafts are cut to the room left.)"""
    model = _model(model_type, **KINDS[model_type])
    ids, _ = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    model.generate(ids, ngram_speculator=spec, **_greedy(model, ids))
    inside, emitted = [], 1  # new-token counts that end inside an accepted draft
    for accepted in spec.last_stats.accepted_per_step:
        inside += [emitted + j for j in range(1, accepted + 1)]
        emitted += accepted + 1
    assert inside, spec.last_stats
    for n in inside[:4]:
        stop = StoppingCriteriaList([StopAtLength(ids.shape[1] + n)])
        kwargs = dict(_greedy(model, ids), stopping_criteria=stop, return_dict_in_generate=True)
        expected = plain_generate(model, ids, **kwargs)
        got = model.generate(ids, ngram_speculator=spec, **kwargs)
        assert got.sequences.tolist() == expected.sequences.tolist() and got.sequences.shape[1] == ids.shape[1] + n
        assert spec.last_stats.stop_reason == "criteria"
        assert got.cache.get_seq_length() == expected.cache.get_seq_length()
        for ours, theirs in zip(got.cache.layers, expected.cache.layers):
            for name, k in (("conv_states", -1), ("recurrent_states", None)):
                for i, plain in (getattr(theirs, name, None) or {}).items():
                    mine = getattr(ours, name)[i]
                    mine = mine[..., -plain.shape[-1]:] if k and plain is not None else mine  # conv: the live window
                    torch.testing.assert_close(mine, plain, rtol=1e-6, atol=1e-6)
            if getattr(theirs, "keys", None) is not None:
                live = theirs.keys.shape[-2]
                torch.testing.assert_close(ours.keys[..., -live:, :], theirs.keys, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model_type, says", [
    ("openai-gpt", "keeps no KV cache"),
    ("rwkv", "keeps its recurrent state in its own object"),
])
def test_models_the_loop_cannot_roll_back_are_refused_before_any_forward(model_type, says):
    model = tiny_model(model_type)
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    ids = torch.tensor([[5, 6, 7, 5, 6, 7]])
    with pytest.raises(UnsupportedGenerationError, match=says) as err:
        model.generate(ids, max_new_tokens=4, ngram_speculator=NgramSpeculator())
    assert model_type in str(err.value) and calls == []


def test_the_custom_generate_folder_runs_without_install(tmp_path):
    """The repository root holds custom_generate/generate.py, as a Hub repository would:
    transformers loads it with trust_remote_code=True and no ngramspec.install()."""
    from pathlib import Path

    from transformers import GenerationMixin

    root = Path(__file__).resolve().parent.parent
    model = _model("llama")
    ids, _ = prompts(model)
    expected = plain_generate(model, ids, **_greedy(model, ids))
    installed = GenerationMixin.generate
    GenerationMixin.generate = installed._ngramspec_original  # as in a process that never installed
    try:
        spec = NgramSpeculator(payoff_sizing=False)
        got = model.generate(ids, custom_generate=str(root), trust_remote_code=True, ngram_speculator=spec,
                             **_greedy(model, ids))
        default = model.generate(ids, custom_generate=str(root), trust_remote_code=True, **_greedy(model, ids))
    finally:
        GenerationMixin.generate = installed
    assert got.tolist() == expected.tolist() == default.tolist()
    assert spec.last_stats.accepted_tokens > 0


def _forgetful_update(self, keys, values, *args, **kwargs):
    """A cache layer that stores but never serves the past (each forward sees its own tokens)."""
    from transformers.cache_utils import DynamicLayer

    DynamicLayer._original_update(self, keys, values, *args, **kwargs)
    return keys, values


@pytest.mark.parametrize("broken, says", [
    ("crop", "did not roll back all its layers"),  # rejected draft tokens would stay
    ("update", "does not decode speculatively as the loop needs"),  # the cache is not attended over
])
def test_the_probe_refuses_a_cache_that_breaks_the_loops_steps(monkeypatch, broken, says):
    """A model whose cache ignores crop, or is not read by its forward, is refused by the
    once-per-model probe, before any forward of the request: never a different output."""
    from transformers.cache_utils import DynamicLayer

    model = _model("llama")
    ids, _ = prompts(model)
    if broken == "crop":
        monkeypatch.setattr(DynamicLayer, "crop", lambda self, n: None)
    else:
        monkeypatch.setattr(DynamicLayer, "_original_update", DynamicLayer.update, raising=False)
        monkeypatch.setattr(DynamicLayer, "update", _forgetful_update)
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs.get("input_ids")),
                                    with_kwargs=True)
    with pytest.raises(UnsupportedGenerationError, match=says):
        model.generate(ids, ngram_speculator=NgramSpeculator(), **_greedy(model, ids))
    assert all(c is None or c.shape[1] <= 6 for c in calls)  # only the probe's six tokens ran


@pytest.mark.parametrize("model_type", ["whisper", "bart", "kosmos-2.5", "roberta"])
def test_a_padded_batch_of_a_model_that_counts_its_own_positions(model_type):
    """Whisper and BART take no position_ids and Kosmos-2.5 drops them (it counts from its
    padding index): each counts positions from its cache, pads included, as plain generate()
    lets it, so the loop passes none and decodes the rows one at a time. RoBERTa also counts
    from a padding index by default, but generate() gives it 0-based ids: so does the loop."""
    kind = "image-text" if model_type == "kosmos-2.5" else "causal"
    model = tiny_model(model_type, dtype=torch.float32, seed=3, kind=kind)
    _, (ids, mask) = prompts(model)
    spec = NgramSpeculator(payoff_sizing=False)
    expected = plain_generate(model, ids, attention_mask=mask, **_greedy(model, ids))
    got = model.generate(ids, attention_mask=mask, ngram_speculator=spec, **_greedy(model, ids))
    assert got.tolist() == expected.tolist()
    assert all(s.accepted_tokens > 0 for s in spec.last_row_stats)


@pytest.mark.parametrize("model_type, broken, says", [
    ("zaya", "replay", "does not decode speculatively"),  # the state before the forward, kept
    ("zaya", "static crop", "did not roll back all its layers"),  # the static attention part not cropped
    ("zamba", "", "recurrent states are"),  # its multi-token forward starts from a zero state
])
def test_the_rollbacks_a_hybrid_needs_beyond_transformers_crop(monkeypatch, model_type, broken, says):
    """Zaya's recurrent layers record only the state before a forward, so a rejection is rolled
    back by replaying the kept tokens; its static cache's hybrid layers crop only their linear
    part, so the loop crops their attention part too. Without either, the model is refused
    before the request's first forward (by the probe's states after its crop of one, or the
    first real crop). Zamba's forward over several tokens ignores the cached state: refused
    (its random-weight logits barely depend on the state, so the probe compares the states)."""
    from ngramspec.hf import target

    model = _model(model_type)
    ids, _ = prompts(model)
    kwargs = _greedy(model, ids)
    if broken == "replay":
        monkeypatch.setattr(target.HFTarget, "_replays", lambda self: False)
    elif broken == "static crop":
        monkeypatch.setattr(target, "_attention_crop", lambda layer: None)
        kwargs["cache_implementation"] = "static"
    with pytest.raises(UnsupportedGenerationError, match=says) as err:
        model.generate(ids, ngram_speculator=NgramSpeculator(payoff_sizing=False), **kwargs)
    assert model_type in str(err.value)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "qwen3_next"])
def test_bfloat16_with_eager_attention_is_identical(model_type):
    """16-bit weights are exact where every kernel gives a row the same result whatever the number
    of rows (on these tiny models, eager attention's matmuls and softmax do on CPU), so a forward
    over several tokens computes what one-token forwards compute (on the default model in
    bfloat16, 7 of 18 real outputs parted at near-ties with sdpa, 1 with eager:
    eval/results/precision). One row and a left-padded batch, drafts accepted."""
    model = tiny_model(model_type, dtype=torch.bfloat16, seed=3, attn_implementation="eager", **KINDS[model_type])
    ids, (batch_ids, mask) = prompts(model)
    for prompt, kwargs in ((ids, {}), (batch_ids, {"attention_mask": mask})):
        spec = NgramSpeculator(payoff_sizing=False)
        expected = plain_generate(model, prompt, **_greedy(model, prompt), **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InexactPrecisionWarning)
            got = model.generate(prompt, ngram_speculator=spec, **_greedy(model, prompt), **kwargs)
        assert got.tolist() == expected.tolist()
        assert sum(s.accepted_tokens for s in spec.last_row_stats) > 0


@pytest.mark.parametrize("dtype, attention, sample, says", [
    (torch.bfloat16, "sdpa", False, "attn_implementation='eager'"),
    (torch.float16, "sdpa", False, "attn_implementation='eager'"),
    (torch.bfloat16, "eager", False, "even with eager attention"),
    (torch.float32, "sdpa", False, None),
    (torch.bfloat16, "sdpa", True, None),  # sampling is exact in distribution, not per token
])
def test_a_16bit_greedy_request_is_warned_once(dtype, attention, sample, says):
    model = tiny_model("llama", dtype=dtype, attn_implementation=attention)
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            model.generate(ids, max_new_tokens=4, do_sample=sample, pad_token_id=0,
                           ngram_speculator=NgramSpeculator())
    ours = [str(w.message) for w in caught if issubclass(w.category, InexactPrecisionWarning)]
    assert len(ours) == (says is not None)
    if says:
        assert str(dtype).removeprefix("torch.") in ours[0] and says in ours[0] and "float32" in ours[0]
