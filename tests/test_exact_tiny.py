"""Greedy speculative output == plain greedy output, token for token, on tiny random Llamas."""

import numpy as np
import pytest
import torch

from ngramspec import NgramSpeculator
from ngramspec.draft.proposal import Draft
from ngramspec.draft.session import SpeculationSession

from conftest import assert_accepted, plain_generate, tiny_llama


def random_prompt(rng, vocab, length):
    # Repeated phrases so that drafts come from the prompt as well as from the output.
    phrase = rng.integers(2, vocab, size=max(2, length // 3))
    reps = [phrase] * 3 + [rng.integers(2, vocab, size=length)]
    return torch.tensor(np.concatenate(reps)[:length][None, :], dtype=torch.long)


CASES = [
    dict(min_n=1, max_n=4, max_draft_tokens=8, verify_cost=((1, 1.0), (8, 1.2))),
    dict(min_n=2, max_n=3, max_draft_tokens=3, match="earliest"),
    dict(min_n=1, max_n=6, max_draft_tokens=16, payoff_sizing=False),
    dict(min_n=3, max_n=5, max_draft_tokens=1, verify_cost=((1, 1.0), (2, 1.05))),
]  # timed sizing in case 1 only: how much a random tiny model's request drafts then follows the machine


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_random_prompts_settings_and_lengths(tiny_model, seed, case):
    rng = np.random.default_rng(100 * case + seed)
    spec = NgramSpeculator(**CASES[case])
    runs = []
    for _ in range(3):
        ids = random_prompt(rng, tiny_model.config.vocab_size, int(rng.integers(1, 60)))
        max_new = int(rng.integers(1, 80))
        expected = plain_generate(tiny_model, ids, max_new_tokens=max_new, do_sample=False)
        got = tiny_model.generate(ids, max_new_tokens=max_new, do_sample=False, ngram_speculator=spec)
        assert got.tolist() == expected.tolist()
        stats = spec.last_stats
        assert stats.new_tokens == got.shape[1] - ids.shape[1] <= max_new
        assert stats.target_forwards <= stats.new_tokens
        runs.append(stats)
    assert_accepted(runs)


@pytest.mark.parametrize("case", range(len(CASES) - 1))
def test_drafts_are_really_used(tiny_model, case):
    """The exactness tests above must exercise acceptance, not just empty drafts."""
    rng = np.random.default_rng(7)
    spec = NgramSpeculator(**CASES[case])
    ids = random_prompt(rng, tiny_model.config.vocab_size, 40)
    tiny_model.generate(ids, max_new_tokens=120, do_sample=False, ngram_speculator=spec)
    assert spec.last_stats.accepted_tokens > 20 and spec.last_stats.mat > 1.3


class ScriptedSpeculator(NgramSpeculator):
    """Proposes a scripted draft from the known greedy continuation: the true tokens (fully
    accepted), a corrupted copy (fully rejected), or true-then-wrong (partly accepted)."""

    def __init__(self, continuation, mode, k=6):
        super().__init__()
        self.continuation, self.mode, self.k = list(continuation), mode, k

    def start(self, prompt_ids, capacity=0):
        return ScriptedSession(self, len(prompt_ids))


class ScriptedSession(SpeculationSession):
    def __init__(self, spec, prompt_len):
        self.spec, self.done = spec, 0

    def propose(self, max_tokens=None, sized=True, tree=True):
        k = self.spec.k if max_tokens is None else min(self.spec.k, max_tokens)
        true = self.spec.continuation[self.done : self.done + k]
        if self.spec.mode == "wrong":
            true = [(t + 1) % 40 for t in true]
        elif self.spec.mode == "half" and len(true) > 1:
            true = true[: len(true) // 2] + [(t + 1) % 40 for t in true[len(true) // 2 :]]
        return Draft(np.array(true, dtype=np.int32))

    def extend(self, accepted_tokens, verified=None):
        self.done += len(accepted_tokens)

    def finish(self):
        pass


@pytest.mark.parametrize("mode", ["right", "wrong", "half"])
@pytest.mark.parametrize("max_new", [1, 2, 7, 50])
def test_fully_accepted_rejected_and_partial_drafts(tiny_model, mode, max_new):
    ids = torch.tensor([[0, 5, 9, 13, 5, 9]])
    expected = plain_generate(tiny_model, ids, max_new_tokens=max_new, do_sample=False)
    spec = ScriptedSpeculator(expected[0, ids.shape[1] :].tolist(), mode)
    got = tiny_model.generate(ids, max_new_tokens=max_new, do_sample=False, ngram_speculator=spec)
    assert got.tolist() == expected.tolist()
    s = spec.last_stats
    if mode == "right" and max_new > 2:
        assert s.accepted_tokens == s.drafted_tokens > 0  # every draft fully accepted
    if mode == "wrong" and max_new > 2:
        assert s.accepted_tokens == 0 and s.drafted_tokens > 0  # every draft fully rejected
        assert s.target_forwards == max_new
    if mode == "half" and max_new > 2:
        assert 0 < s.accepted_tokens < s.drafted_tokens  # every draft kept up to its wrong half
    if max_new <= 2:  # the prefill emits the first token; a draft would leave the step no room for its own
        assert s.drafted_tokens == 0


@pytest.mark.parametrize("eos_offset", [1, 3, 5])
def test_eos_inside_accepted_draft_stops_there(tiny_model, eos_offset):
    ids = torch.tensor([[0, 3, 8, 3, 8, 12]])
    reference = plain_generate(tiny_model, ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1] :].tolist()
    # Make a token that first appears at position eos_offset the EOS: plain greedy stops there.
    eos = next(t for i, t in enumerate(reference) if i >= eos_offset and t not in reference[:i])
    expected = plain_generate(tiny_model, ids, max_new_tokens=40, do_sample=False, eos_token_id=eos)
    spec = ScriptedSpeculator(reference, "right", k=10)  # the draft runs past the EOS
    got = tiny_model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=eos, ngram_speculator=spec)
    assert got.tolist() == expected.tolist()
    assert got[0, -1].item() == eos and spec.last_stats.stop_reason == "eos"
    assert spec.last_stats.accepted_tokens > 0


def test_several_eos_ids_and_max_length(tiny_model):
    ids = torch.tensor([[0, 4, 4, 7, 4, 4]])
    reference = plain_generate(tiny_model, ids, max_new_tokens=30, do_sample=False)[0, ids.shape[1] :].tolist()
    # the EOS ids: a token that first appears after 10 tokens (so drafts come before it) and one never produced
    eos_ids = [next(t for i, t in enumerate(reference) if i >= 10 and t not in reference[:i]), 39]
    expected = plain_generate(tiny_model, ids, max_new_tokens=30, do_sample=False, eos_token_id=eos_ids)
    spec = NgramSpeculator()
    got = tiny_model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=eos_ids, ngram_speculator=spec)
    assert got.tolist() == expected.tolist()
    assert_accepted(spec)
    for max_length in (7, 8, 20):  # max_length counts the prompt, as in transformers
        expected = plain_generate(tiny_model, ids, max_length=max_length, do_sample=False)
        got = tiny_model.generate(ids, max_length=max_length, do_sample=False, ngram_speculator=spec)
        assert got.tolist() == expected.tolist() and got.shape[1] == max_length
        if max_length - ids.shape[1] > 2:  # with 1 or 2 new tokens there is no room for a draft
            assert_accepted(spec)


def test_left_padded_prompt_with_attention_mask(tiny_model):
    ids = torch.tensor([[1, 1, 0, 6, 2, 6, 2, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    expected = plain_generate(tiny_model, ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
    spec = NgramSpeculator()
    got = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, ngram_speculator=spec)
    assert got.tolist() == expected.tolist()
    assert spec.last_stats.accepted_tokens > 0


@pytest.mark.parametrize("seed", [1, 2])
def test_other_vocab_sizes_and_float32(seed):
    model = tiny_llama(vocab_size=300, seed=seed, dtype=torch.float32)
    rng = np.random.default_rng(seed)
    # A flat fixed curve: with timed costs, how much a random tiny model's request drafts follows
    # this machine's timings (never the output), and some runs drafted too little to test the
    # verifier. Timed sizing is tested above.
    spec = NgramSpeculator(verify_cost=((1, 1.0), (512, 1.0)))
    for _ in range(3):
        ids = random_prompt(rng, 300, 30)
        expected = plain_generate(model, ids, max_new_tokens=60, do_sample=False)
        got = model.generate(ids, max_new_tokens=60, do_sample=False, ngram_speculator=spec)
        assert got.tolist() == expected.tolist()
        assert_accepted(spec)


def _tiny(arch: str):
    """Tiny random models of other architectures (float64, no downloads)."""
    import transformers as tf

    torch.manual_seed(3)
    if arch == "mistral-sliding-window":  # window 16 < prompt + output: sliding cache layers
        config = tf.MistralConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
                                  max_position_embeddings=512)
        model = tf.MistralForCausalLM(config)
    elif arch == "gpt2":  # learned absolute positions, fused QKV, no GQA
        model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=512))
    elif arch == "qwen2":
        config = tf.Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        model = tf.Qwen2ForCausalLM(config)
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


@pytest.mark.parametrize("arch", ["mistral-sliding-window", "gpt2", "qwen2"])
def test_other_architectures(arch):
    model = _tiny(arch)
    rng = np.random.default_rng(11)
    spec = NgramSpeculator(**CASES[0])
    accepted = 0
    for _ in range(4):
        ids = random_prompt(rng, 40, 30)
        expected = plain_generate(model, ids, max_new_tokens=60, do_sample=False)
        got = model.generate(ids, max_new_tokens=60, do_sample=False, ngram_speculator=spec)
        assert got.tolist() == expected.tolist()
        accepted += spec.last_stats.accepted_tokens
    assert accepted > 0


def test_speculation_switches_off_when_it_does_not_pay(tiny_model):
    """With a cost curve where every extra verified token costs a full forward, payoff sizing
    declines every draft (plain steps, still exact) and the stats say so; with a flat curve the
    same prompt drafts."""
    ids = random_prompt(np.random.default_rng(3), 40, 45)
    expected = plain_generate(tiny_model, ids, max_new_tokens=60, eos_token_id=None)
    steep = NgramSpeculator(min_n=1, verify_cost=((1, 1.0), (2, 2.0)))
    got = tiny_model.generate(ids, max_new_tokens=60, eos_token_id=None, ngram_speculator=steep)
    assert got.tolist() == expected.tolist()
    assert steep.last_stats.drafted_tokens == 0 and steep.last_stats.declined_steps > 10
    flat = NgramSpeculator(min_n=1, verify_cost=((1, 1.0), (64, 1.0)))
    got = tiny_model.generate(ids, max_new_tokens=60, eos_token_id=None, ngram_speculator=flat)
    assert got.tolist() == expected.tolist()
    assert flat.last_stats.drafted_tokens > 0 and flat.last_stats.declined_steps == 0
    assert_accepted(flat)
