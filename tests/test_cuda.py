"""The GPU path (skipped without CUDA; `eval/gpu_check.sh` runs it on a GPU machine).

The same exactness checks as on CPU with the model and every tensor on the device (the n-gram
index stays on the host), and the host-device sync budget: one sync per decode step, the one
that reads the target's choices. float64 tiny models keep greedy comparisons free of ties.
"""

import warnings

import numpy as np
import pytest
import torch

from ngramspec import NgramSpeculator
from ngramspec.hf.target import left_pad

from conftest import PROCESSOR_CASES, plain_generate, tiny_llama
from test_batch import PAD, repetitive_rows
from test_exact_tiny import random_prompt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FLAT = ((1, 1.0), (512, 1.0))  # drafting always pays: every step verifies a draft


@pytest.fixture(scope="module")
def cuda_model():
    return tiny_llama().to("cuda")


def recording_sessions(spec: NgramSpeculator) -> list:
    """Make ``spec`` keep every session that generate() starts (to inspect the host index)."""
    sessions, start = [], spec.start
    spec.start = lambda *args, **kwargs: sessions.append(start(*args, **kwargs)) or sessions[-1]
    return sessions


@pytest.mark.parametrize("seed", range(4))
def test_greedy_rows_equal_plain_on_cuda(cuda_model, seed):
    rng = np.random.default_rng(seed)
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT)
    sessions, accepted = recording_sessions(spec), 0
    for _ in range(3):
        ids = random_prompt(rng, cuda_model.config.vocab_size, int(rng.integers(2, 60))).cuda()
        max_new = int(rng.integers(1, 80))
        got = cuda_model.generate(ids, max_new_tokens=max_new, ngram_speculator=spec)
        assert got.device.type == "cuda"
        assert got.tolist() == plain_generate(cuda_model, ids, max_new_tokens=max_new).tolist()
        # The index lives on the host and holds exactly the returned sequence (prompt + every
        # emitted token): the device choices reached it, and nothing else did.
        stream = sessions[-1].tokens
        assert type(stream) is np.ndarray and stream.dtype == np.int32
        assert stream.tolist() == got[0].tolist()
        accepted += spec.last_stats.accepted_tokens
    assert len(sessions) == 3 and accepted > 0, "no draft was accepted: verification went untested"


@pytest.mark.parametrize("processor_kwargs", PROCESSOR_CASES)
def test_processors_on_cuda(cuda_model, processor_kwargs):
    ids = random_prompt(np.random.default_rng(3), cuda_model.config.vocab_size, 40).cuda()
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT)
    got = cuda_model.generate(ids, max_new_tokens=60, ngram_speculator=spec, **processor_kwargs)
    assert got.tolist() == plain_generate(cuda_model, ids, max_new_tokens=60, **processor_kwargs).tolist()


@pytest.mark.parametrize("seed", range(3))
def test_batches_equal_plain_batched_on_cuda(cuda_model, seed):
    rng = np.random.default_rng(seed)
    ids, mask = left_pad(repetitive_rows(rng, 5), PAD)
    ids, mask = ids.cuda(), mask.cuda()
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT)
    got = cuda_model.generate(ids, attention_mask=mask, max_new_tokens=120, eos_token_id=None, ngram_speculator=spec)
    expected = plain_generate(cuda_model, ids, attention_mask=mask, max_new_tokens=120, eos_token_id=None)
    assert got.tolist() == expected.tolist()


def test_token_trees_on_cuda(cuda_model):
    ids = random_prompt(np.random.default_rng(5), cuda_model.config.vocab_size, 50).cuda()
    spec = NgramSpeculator(min_n=1, tree_branches=3, verify_cost=FLAT)
    got = cuda_model.generate(ids, max_new_tokens=80, eos_token_id=None, ngram_speculator=spec)
    assert got.tolist() == plain_generate(cuda_model, ids, max_new_tokens=80, eos_token_id=None).tolist()


def _syncs_and_forwards(model, **kwargs) -> tuple[int, int]:
    """Synchronizing CUDA calls and model forwards during one generate() call."""
    forwards = []
    hook = model.register_forward_pre_hook(lambda *args: forwards.append(1))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.generate(**kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        hook.remove()
    return sum("synchroniz" in str(w.message) for w in caught), len(forwards)


def _syncs_per_forward(model, **kwargs) -> float:
    syncs, forwards = _syncs_and_forwards(model, **kwargs)
    return syncs / forwards


@pytest.mark.parametrize("extra", [{}, dict(repetition_penalty=1.3), dict(do_sample=True, top_k=5),
                                   dict(do_sample=True, top_p=0.9, temperature=0.7),
                                   dict(do_sample=True, top_k=8, repetition_penalty=1.3)])
@pytest.mark.parametrize("branches", [1, 3])
def test_one_sync_per_step(cuda_model, extra, branches):
    """Per forward, ngramspec syncs no more than plain generate() does (which reads whether to
    stop once per step) plus a small allowance for setup spread over the steps; chains and
    token trees. (tests/test_syncs.py counts the same on CPU, exactly.)"""
    ids = random_prompt(np.random.default_rng(9), cuda_model.config.vocab_size, 40).cuda()
    common = dict(input_ids=ids, max_new_tokens=150, eos_token_id=None, **extra)
    plain = _syncs_per_forward(cuda_model, **common)
    spec = NgramSpeculator(min_n=1, verify_cost=FLAT, tree_branches=branches)
    ours = _syncs_per_forward(cuda_model, ngram_speculator=spec, **common)
    assert spec.last_stats.drafted_tokens > 0
    assert ours <= plain + 0.25, f"{ours:.2f} syncs per forward vs plain generate's {plain:.2f}"


def test_online_cost_model_adds_no_sync_and_times_every_forward(cuda_model):
    """The default speculator times every forward with CUDA events read later: every timed
    forward (all but the prefill) reaches the cost model, and the syncs beyond one per forward
    are those of a fixed cost curve (no timer): timing adds none."""
    ids = random_prompt(np.random.default_rng(9), cuda_model.config.vocab_size, 40).cuda()
    common = dict(input_ids=ids, max_new_tokens=150, eos_token_id=None)
    fixed_syncs, fixed_forwards = _syncs_and_forwards(
        cuda_model, ngram_speculator=NgramSpeculator(min_n=1, verify_cost=FLAT), **common)
    spec = NgramSpeculator(min_n=1)  # verify_cost=None: the online cost model
    syncs, forwards = _syncs_and_forwards(cuda_model, ngram_speculator=spec, **common)
    assert spec.cost_model.observations == forwards - 1, f"{spec.cost_model.observations} timings, {forwards} forwards"
    assert syncs - forwards <= fixed_syncs - fixed_forwards, (
        f"online: {syncs} syncs over {forwards} forwards; fixed curve: {fixed_syncs} over {fixed_forwards}")
