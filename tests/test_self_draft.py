"""Self-speculation in generate() (SpeculatorConfig.self_draft_layers): where the n-gram index has
no match, the target's own first layers draft on its own cache. Greedy output must stay token for
token plain greedy's, with shallow drafts proposed and (some) accepted."""

from __future__ import annotations

import pytest
import torch

from ngramspec import NgramSpeculator, UnsupportedGenerationError
from ngramspec.draft.config import SettingError, SpeculatorConfig

from conftest import plain_generate, tiny_llama

VOCAB = 300


def distinct_prompt(length: int = 24, seed: int = 1) -> torch.Tensor:
    """Tokens that never repeat: the first steps have no n-gram match, so they self-draft."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randperm(VOCAB - 2, generator=generator)[:length] + 2)[None]


def generate(model, ids, max_new_tokens=40, **settings):
    speculator = NgramSpeculator(verify_cost=((1, 1.0), (64, 1.0)), **settings)  # every draft pays
    out = model.generate(ids, ngram_speculator=speculator, do_sample=False, max_new_tokens=max_new_tokens)
    return out, speculator.last_stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_all_layers_draft_what_the_target_emits(seed):
    """k = every layer: the shallow draft is the full model's own greedy continuation, so (in
    float64) every shallow draft token is accepted, and the output is plain greedy's."""
    model = tiny_llama(vocab_size=VOCAB, seed=seed)
    ids = distinct_prompt(seed=seed)
    expected = plain_generate(model, ids, do_sample=False, max_new_tokens=40)
    out, stats = generate(model, ids, self_draft_layers=2)
    assert torch.equal(out, expected)
    assert stats.self_drafted_tokens > 0
    assert stats.self_accepted_tokens == stats.self_drafted_tokens or stats.new_tokens == 40
    assert stats.self_accepted_tokens >= stats.self_drafted_tokens - 4  # the last draft may run past the cap
    assert stats.self_accepted_tokens <= stats.accepted_tokens
    assert stats.target_forwards < stats.new_tokens  # the drafts saved forwards


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tokens", [1, 3])
def test_shallow_drafts_leave_greedy_output_unchanged(seed, tokens):
    """k = 1 of 2 layers: drafts that are often wrong; the shallow cache entries are cropped, so
    the verify forward sees the cache plain decoding has and the output is identical."""
    model = tiny_llama(vocab_size=VOCAB, seed=seed)
    ids = distinct_prompt(seed=seed + 10)
    expected = plain_generate(model, ids, do_sample=False, max_new_tokens=40)
    out, stats = generate(model, ids, self_draft_layers=1, self_draft_tokens=tokens)
    assert torch.equal(out, expected)
    assert stats.self_drafted_tokens > 0
    assert stats.self_accepted_tokens <= stats.self_drafted_tokens


def test_off_by_default_and_under_sampling():
    model = tiny_llama(vocab_size=VOCAB)
    ids = distinct_prompt()
    assert SpeculatorConfig().self_draft_layers == 0
    _, stats = generate(model, ids)
    assert stats.self_drafted_tokens == 0
    speculator = NgramSpeculator(self_draft_layers=2)
    torch.manual_seed(0)
    model.generate(ids, ngram_speculator=speculator, do_sample=True, max_new_tokens=20)
    assert speculator.last_stats.self_drafted_tokens == 0  # a shallow draft is a greedy point mass


def test_bad_settings_are_refused():
    with pytest.raises(SettingError, match="self_draft_layers"):
        SpeculatorConfig(self_draft_layers=-1)
    with pytest.raises(SettingError, match="self_draft_tokens"):
        SpeculatorConfig(self_draft_tokens=0)
    model = tiny_llama(vocab_size=VOCAB)
    with pytest.raises(UnsupportedGenerationError, match="2 decoder layers"):
        generate(model, distinct_prompt(), self_draft_layers=3)
