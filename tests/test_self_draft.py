"""Self-speculation in generate() (SpeculatorConfig.self_draft_layers): where the n-gram index has
no match, the target's own first layers draft on its own cache. Greedy output must stay token for
token plain greedy's, with shallow drafts proposed and (some) accepted."""

from __future__ import annotations

import pytest
import torch

from ngramspec import NgramSpeculator, UnsupportedGenerationError
from ngramspec.draft.config import SettingError, SpeculatorConfig
from ngramspec.hf.shallow import ShallowEvidence, shallow_evidence

from conftest import plain_generate, tiny_llama

VOCAB = 300


def distinct_prompt(length: int = 24, seed: int = 1) -> torch.Tensor:
    """Tokens that never repeat: the first steps have no n-gram match, so they self-draft."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randperm(VOCAB - 2, generator=generator)[:length] + 2)[None]


def generate(model, ids, max_new_tokens=40, speculator=None, **settings):
    """Every draft is verified: payoff sizing off (no shallow draft on a 2-layer model pays)."""
    speculator = speculator or NgramSpeculator(payoff_sizing=False, **settings)
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


FLAT = ((1, 1.0), (64, 1.0))  # a verify costs one plain step whatever its length


def _evidence(accepted: int, refused: int, cost: float) -> ShallowEvidence:
    evidence = ShallowEvidence(SpeculatorConfig(), 1, 1)
    evidence.accepted, evidence.refused, evidence.prior_cost = accepted, refused, cost
    return evidence


@pytest.mark.parametrize("accepted, refused, cost", [
    (90, 10, 0.1), (90, 10, 0.5), (45, 55, 0.5), (50, 50, 1.0), (0, 0, 0.3), (99, 1, 0.05), (10, 90, 0.01),
])
def test_the_sizing_rule_drafts_the_length_that_emits_most_per_cost(accepted, refused, cost):
    """m shallow tokens emit 1 + a + ... + a^m per (verify of m + 1 tokens + m shallow
    forwards); the rule's length is the best m of 0..4, 0 where a plain step emits more."""
    evidence = _evidence(accepted, refused, cost)
    a = evidence.agreement
    assert a == pytest.approx((accepted + 0.5 * 4) / (accepted + refused + 4))

    def verify(q, context):
        return 1.0 + 0.05 * (q - 1)

    value = [sum(a ** j for j in range(m + 1)) / (verify(m + 1, 0) + m * cost) for m in range(5)]
    best = max(range(5), key=lambda m: (value[m], -m))
    assert evidence.length(verify, 400, 4) == best
    assert evidence.length(verify, 400, 0) == 0


def test_a_shallow_draft_that_does_not_pay_is_declined_and_said():
    """All layers of the model: a shallow step costs a full one, so no draft pays; the steps
    with no match are plain steps, counted as declined, and the output is plain greedy's."""
    model = tiny_llama(vocab_size=VOCAB, seed=0)
    ids = distinct_prompt(seed=0)
    expected = plain_generate(model, ids, do_sample=False, max_new_tokens=40)
    out, stats = generate(model, ids, speculator=NgramSpeculator(verify_cost=FLAT, self_draft_layers=2,
                                                                 self_draft_only=True))
    assert torch.equal(out, expected)
    assert stats.self_drafted_tokens == 0 and stats.declined_steps == stats.target_forwards - 1


def test_where_the_evidence_says_shallow_drafts_pay_they_are_drafted_and_it_learns():
    """Half the layers (cost 0.5 of a step) and an agreement seeded at 0.95: drafts pay, so the
    drafter drafts; what the target refuses lowers the agreement it sizes the next ones by."""
    model = tiny_llama(vocab_size=VOCAB, seed=1)
    ids = distinct_prompt(seed=11)
    speculator = NgramSpeculator(verify_cost=FLAT, self_draft_layers=1, self_draft_only=True)
    evidence = shallow_evidence(speculator, model)
    evidence.accepted = 80
    before = evidence.agreement
    expected = plain_generate(model, ids, do_sample=False, max_new_tokens=40)
    out, stats = generate(model, ids, speculator=speculator)
    assert torch.equal(out, expected)
    assert stats.self_drafted_tokens > 0 and evidence.refused > 0 and evidence.agreement < before
    assert shallow_evidence(speculator, model) is evidence  # kept for the speculator's next call


def test_self_draft_only_needs_the_shallow_drafter():
    with pytest.raises(SettingError, match="self_draft_only needs self_draft_layers"):
        SpeculatorConfig(self_draft_only=True)
