"""Speculative sampling draws from exactly the target's distribution.

A tiny random Llama (one layer, one head: the test pays for thousands of generate() calls, not
for depth) with a 6-token vocabulary continues a repetitive prompt by 3 tokens: the prefill
samples the first, then one verify pass checks a lookup draft for the second (which the target
sometimes accepts, sometimes rejects) and samples the next. The exact distribution of the 216
possible continuations is computed from the model (softmax of the warped logits, chained over
the three positions); N samples of speculative sampling are compared with it by a chi-square
goodness-of-fit test (cells with an expected count below 5 are pooled), one test per sampling
setting.

Power: with N = 3000 a deviation of noncentrality N * sum((q - p)^2 / p) >= 96 (e.g. 1.8% of
the mass moved between two cells of p = 0.02: 3000 * 2 * 0.018^2 / 0.02 = 97) is detected at
alpha = 0.001 with power >= 0.8: the settings have 27 to 216 cells, and a noncentral
chi-square with 215 degrees of freedom exceeds the critical value with probability 0.82 at
noncentrality 96 (0.96 at 125 cells, 1.00 at 27).
``test_the_chi_square_tests_have_their_stated_power`` computes this for every setting. The same
test applied to plain transformers sampling checks the exact computation itself.
"""

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ngramspec import NgramSpeculator

from conftest import assert_accepted, plain_generate

VOCAB, NEW, N, ALPHA = 6, 3, 3000, 1e-3
PROMPT = torch.tensor([[0, 2, 3, 4, 2, 3, 4, 2, 3]])


class BanAfterTwo(LogitsProcessor):
    """A user processor that depends on the prefix: after token 2, token 4 is banned."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[input_ids[:, -1] == 2, 4] = -float("inf")  # row by row: batches too
        return scores


SETTINGS = {
    "temperature": (dict(temperature=1.3), [TemperatureLogitsWarper(1.3)]),
    "top_k": (dict(temperature=1.0, top_k=3), [TopKLogitsWarper(3)]),
    "top_p": (dict(temperature=0.9, top_p=0.8), [TemperatureLogitsWarper(0.9), TopPLogitsWarper(0.8)]),
    "min_p": (dict(temperature=1.0, min_p=0.15), [MinPLogitsWarper(0.15)]),
    "user_processor": (dict(temperature=1.0, logits_processor=LogitsProcessorList([BanAfterTwo()])), [BanAfterTwo()]),
}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=64,
                         bos_token_id=0, eos_token_id=None, pad_token_id=1)  # 1: not in PROMPT, or
    # generate() would treat those prompt tokens as padding and mask them out
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2.5)  # peaked enough that drafts are often accepted, not always
    return model


def exact_distribution(model, warpers) -> dict:
    """P(x1..xn) = prod_i p(x_i | prompt, x_<i), each factor after the warpers."""
    processors = LogitsProcessorList(warpers)

    def probs(prefix):
        ids = torch.cat([PROMPT, torch.tensor([list(prefix)], dtype=torch.long)], dim=1)
        with torch.no_grad():
            logits = model(ids).logits[:, -1].float()
        return torch.softmax(processors(ids, logits), dim=-1)[0].double()

    table = {(): 1.0}
    for _ in range(NEW):
        table = {prefix + (x,): p * float(q[x]) for prefix, p in table.items() if p > 0
                 for q in [probs(prefix)] for x in range(VOCAB)}
    return table


def chi_square_p(counts: dict, exact: dict, n: int) -> float:
    assert set(counts) <= {k for k, p in exact.items() if p > 0}, "sampled an impossible continuation"
    cells = sorted(exact, key=lambda k: -exact[k])
    observed, expected, pool_o, pool_e = [], [], 0, 0.0
    for key in cells:
        if exact[key] * n >= 5:
            observed.append(counts.get(key, 0))
            expected.append(exact[key] * n)
        else:
            pool_o += counts.get(key, 0)
            pool_e += exact[key] * n
    if pool_e > 0:
        observed.append(pool_o)
        expected.append(pool_e)
    return float(stats.chisquare(observed, np.array(expected) * sum(observed) / sum(expected)).pvalue)


def draw(model, kwargs, speculative, n=N, seed=0):
    torch.manual_seed(seed)
    spec = NgramSpeculator(min_n=1, max_n=3, max_draft_tokens=2, payoff_sizing=False) if speculative else None
    counts, accepted = {}, 0
    for _ in range(n):
        if speculative:
            out = model.generate(PROMPT, max_new_tokens=NEW, do_sample=True, ngram_speculator=spec, **kwargs)
            accepted += spec.last_stats.accepted_tokens
        else:
            out = plain_generate(model, PROMPT, max_new_tokens=NEW, do_sample=True, **kwargs)
        key = tuple(out[0, PROMPT.shape[1] :].tolist())
        counts[key] = counts.get(key, 0) + 1
    return counts, accepted


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_speculative_sampling_matches_the_exact_distribution(model, setting):
    kwargs, warpers = SETTINGS[setting]
    exact = exact_distribution(model, warpers)
    counts, accepted = draw(model, kwargs, speculative=True)
    assert accepted > N // 20, "drafts were rarely accepted: the test would not exercise verification"
    p = chi_square_p(counts, exact, N)
    print(f"\n{setting}: chi-square p = {p:.3f} ({accepted} drafted tokens accepted over {N} samples)")
    assert p > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["top_p", "user_processor"])
def test_all_positions_at_once_samples_the_exact_distribution(model, setting, monkeypatch):
    """The accelerator way (every draft position sampled at once, one sync), forced on CPU,
    passes the same goodness-of-fit test; the forced path really decided the drafted steps."""
    from ngramspec.hf import verify

    forced = []
    monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: forced.append(1) or True)
    kwargs, warpers = SETTINGS[setting]
    counts, accepted = draw(model, kwargs, speculative=True)
    assert len(forced) > N // 20, "the all-at-once path was not taken: the test would check the CPU path"
    assert accepted > N // 20, "drafts were rarely accepted: the test would not exercise verification"
    p = chi_square_p(counts, exact_distribution(model, warpers), N)
    print(f"\n{setting}, all at once: chi-square p = {p:.3f} ({len(forced)} steps, {accepted} accepted)")
    assert p > ALPHA


@pytest.mark.slow
def test_plain_sampling_matches_the_exact_distribution(model):
    """Checks the exact computation (and the warper order) against transformers itself: N rows
    of one plain sampling call (rows are sampled independently, so that is N draws)."""
    kwargs, warpers = SETTINGS["top_p"]
    counts, _ = draw_batched(model, kwargs, speculative=False, n=N)
    assert chi_square_p(counts, exact_distribution(model, warpers), N) > ALPHA


def pooled_cells(exact: dict, n: int) -> int:
    """The number of cells chi_square_p tests (the pool of small cells counts as one)."""
    large = sum(1 for p in exact.values() if p * n >= 5)
    return large + (large < sum(1 for p in exact.values() if p > 0))


def test_the_chi_square_tests_have_their_stated_power(model):
    """The module docstring's power, computed for every setting from its exact distribution:
    noncentrality 96 is detected at ALPHA with probability >= 0.8 (and >= 0.99 at 150)."""
    for setting, (_, warpers) in SETTINGS.items():
        df = pooled_cells(exact_distribution(model, warpers), N) - 1
        critical = stats.chi2.ppf(1 - ALPHA, df)
        power = stats.ncx2.sf(critical, df, 96)
        assert power >= 0.8 and stats.ncx2.sf(critical, df, 150) >= 0.99, (setting, df, power)


def test_a_biased_sampler_would_be_caught(model):
    """Power check: a sampler that always accepts the draft (a classic bug) fails the test."""
    kwargs, warpers = SETTINGS["temperature"]
    exact = exact_distribution(model, warpers)
    biased = dict(exact)
    top = max(biased, key=biased.get)
    # Shift 4% of the mass onto the most likely continuation, as a too-eager acceptance would.
    scale = (1 - biased[top] - 0.04) / (1 - biased[top])
    biased = {k: (v * scale if k != top else v + 0.04) for k, v in biased.items()}
    rng = np.random.default_rng(0)
    keys = list(biased)
    draws = rng.choice(len(keys), size=N, p=np.array([biased[k] for k in keys]) / sum(biased.values()))
    counts = {}
    for i in draws:
        counts[keys[i]] = counts.get(keys[i], 0) + 1
    assert chi_square_p(counts, exact, N) < ALPHA


def test_seeded_sampling_is_reproducible(model):
    spec = NgramSpeculator(min_n=1, payoff_sizing=False)
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        out = model.generate(PROMPT, max_new_tokens=20, do_sample=True, temperature=1.2, ngram_speculator=spec)
        runs.append(out.tolist())
        assert_accepted(spec)  # else both runs were plain sampling
    assert runs[0] == runs[1]


# --- Batched: num_return_sequences rows sampled together, plain vs speculative -----------------


def draw_batched(model, kwargs, speculative, n=N, seed=1):
    """n continuations from ONE generate call with num_return_sequences=n (rows of one batch,
    each verified with its own acceptance)."""
    torch.manual_seed(seed)
    extra = {}
    if speculative:
        extra["ngram_speculator"] = NgramSpeculator(min_n=1, max_n=3, max_draft_tokens=2, payoff_sizing=False)
    generate = model.generate if speculative else (lambda *a, **k: plain_generate(model, *a, **k))
    out = generate(PROMPT, max_new_tokens=NEW, do_sample=True, num_return_sequences=n, **kwargs, **extra)
    counts = {}
    for row in out[:, PROMPT.shape[1] :].tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    accepted = sum(s.accepted_tokens for s in extra["ngram_speculator"].last_row_stats) if speculative else 0
    return counts, accepted


def two_sample_p(counts_a: dict, counts_b: dict, exact: dict, n: int) -> float:
    """Chi-square test of homogeneity between two samples (cells as in chi_square_p)."""
    cells = sorted(exact, key=lambda k: -exact[k])
    table, pool = [], [0, 0]
    for key in cells:
        pair = [counts_a.get(key, 0), counts_b.get(key, 0)]
        if exact[key] * n >= 5:
            table.append(pair)
        else:
            pool = [pool[0] + pair[0], pool[1] + pair[1]]
    if sum(pool):
        table.append(pool)
    table = [row for row in table if sum(row)]
    return float(stats.chi2_contingency(np.array(table).T).pvalue)


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_batched_speculative_sampling_matches_plain_sampling(model, setting, verify_mode):
    """Plain sampling vs speculative sampling, each N = 3000 rows of one batch: homogeneity
    chi-square, plus speculative vs the exact distribution.

    Power of the two-sample test (alpha = 0.001, 20-40 cells): a deviation of noncentrality
    N/2 * sum((q - p)^2 / p) >= 60, e.g. 4.5% of the mass moved between two cells of p = 0.1,
    is detected with probability >= 0.94 (noncentral chi-square, df 40; 0.99 at df 20)."""
    kwargs, warpers = SETTINGS[setting]
    exact = exact_distribution(model, warpers)
    spec_counts, accepted = draw_batched(model, kwargs, speculative=True)
    plain_counts, _ = draw_batched(model, kwargs, speculative=False, seed=2)
    assert accepted > N // 20, "drafts were rarely accepted: the test would not exercise verification"
    p_plain = two_sample_p(spec_counts, plain_counts, exact, N)
    p_exact = chi_square_p(spec_counts, exact, N)
    print(f"\n{setting} (batch of {N}): speculative vs plain p = {p_plain:.3f}, vs exact p = {p_exact:.3f}, "
          f"{accepted} drafted tokens accepted")
    assert p_plain > ALPHA and p_exact > ALPHA


def test_two_sample_test_catches_a_biased_sampler(model):
    """Power check for the homogeneity test: 4.5% of the mass moved onto the top cell."""
    kwargs, warpers = SETTINGS["temperature"]
    exact = exact_distribution(model, warpers)
    top = max(exact, key=exact.get)
    scale = (1 - exact[top] - 0.045) / (1 - exact[top])
    biased = {k: (v * scale if k != top else v + 0.045) for k, v in exact.items()}
    rng = np.random.default_rng(1)

    def sample(dist):
        keys = list(dist)
        draws = rng.choice(len(keys), size=N, p=np.array([dist[k] for k in keys]) / sum(dist.values()))
        counts = {}
        for i in draws:
            counts[keys[i]] = counts.get(keys[i], 0) + 1
        return counts

    assert two_sample_p(sample(biased), sample(exact), exact, N) < ALPHA
    assert two_sample_p(sample(exact), sample(exact), exact, N) > ALPHA  # and no false alarm here


def test_seeded_batched_sampling_is_reproducible(model):
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        ids = torch.cat([PROMPT, PROMPT]).clone()
        spec = NgramSpeculator(min_n=1)
        out = model.generate(ids, max_new_tokens=15, do_sample=True, num_return_sequences=3, ngram_speculator=spec)
        runs.append(out.tolist())
        assert_accepted(spec)  # else both runs were plain sampling
    assert runs[0] == runs[1] and len(runs[0]) == 6


@pytest.mark.parametrize("batched", [False, True])
def test_what_is_drafted_never_changes_a_seeded_sample(model, batched, monkeypatch):
    """Each output position is sampled with its own pre-drawn uniform, so for one seed every
    drafting setting (none accepted, short chains, long chains, trees, every position at once)
    emits the same tokens. A sampler that drew from a shared stream per step would differ
    here as soon as two settings accept different numbers of tokens in some step."""
    from ngramspec.hf import verify

    ids = torch.cat([PROMPT, PROMPT]) if batched else PROMPT
    extra = dict(num_return_sequences=3) if batched else {}
    settings = [dict(min_n=5, max_n=5), dict(min_n=1, max_draft_tokens=1), dict(min_n=1, max_draft_tokens=8),
                dict(min_n=1, max_draft_tokens=8, tree_branches=3), dict(min_n=1, max_draft_tokens=8)]
    outputs, accepted = [], []
    for i, setting in enumerate(settings):
        if i == len(settings) - 1:
            monkeypatch.setattr(verify, "reads_all_positions_at_once", lambda logits: True)
        torch.manual_seed(5)
        spec = NgramSpeculator(payoff_sizing=False, **setting)
        out = model.generate(ids, max_new_tokens=24, do_sample=True, temperature=1.2, ngram_speculator=spec,
                             **extra)
        outputs.append(out.tolist())
        accepted.append(spec.last_stats.accepted_tokens)
    assert accepted[0] == 0 and min(accepted[1:]) > 0 and len(set(accepted[1:])) > 1, accepted
    assert all(o == outputs[0] for o in outputs[1:])
